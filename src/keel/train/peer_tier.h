// Tier-0 checkpoints from the trainer's side: where this rank's copies go (its own host's holder
// and the next host's, the buddy, in `keel launch`'s order), and on a restart the newest copy the
// surviving holders keep whole, read through the ordinary checkpoint reader.
//
//   std::optional<PeerTier> t = PeerTierFromEnv(run_dir);   // KEEL_PEER_HOLDERS, from keel launch
//   ckpt::PeerTarget to = t->Target(rate_mbit);              // for CheckpointWriter::Begin
//   int64_t s = WholePeerCopies(*t).at(0);                   // the newest whole copy
//   PeerRead read;
//   ckpt::CheckpointReader r = OpenPeerCopy(*t, s, &read);   // throws when a file is gone
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "keel/ckpt/reader.h"
#include "keel/ckpt/writer.h"

namespace keel::train {

inline constexpr const char* kPeerHoldersEnv = "KEEL_PEER_HOLDERS";

struct PeerTier {
  std::string run;                        // the run's name in the holders (its folder's hash)
  std::vector<ckpt::peer::Address> ring;  // every host's holder, in the launcher's order
  int self = 0;                           // this host's place in the ring
  ckpt::PeerTarget Target(double rate_mbit) const;
};

// From $KEEL_PEER_HOLDERS ("HOST:PORT,..." in host order) and this host's name; nullopt when it is
// not set. Throws keel::Error (bad input) when the list is malformed or leaves this host out.
std::optional<PeerTier> PeerTierFromEnv(const std::string& run_dir);

// The steps whose copies the reachable holders keep whole (the manifest and every rank's files,
// somewhere), newest first. Holders that do not answer are skipped.
std::vector<int64_t> WholePeerCopies(const PeerTier& t);

// Which copies served the files of a tier-0 restore: the one on the holder of the host that wrote
// the file, or the buddy's (another host's).
struct PeerRead {
  int own_copies = 0, buddy_copies = 0;  // files, by the copy read
  int from_local_disk = 0;  // of those, files a restarted holder reloaded from its host's disk
  std::vector<std::string> buddy_files;  // "rank_00002.bin from kl1"
};

// A reader over the copy of `step`: each file from this host's holder when it has it, else the
// buddy's, else any other. Throws keel::Error (bad input) when the copy is no longer whole.
ckpt::CheckpointReader OpenPeerCopy(const PeerTier& t, int64_t step, PeerRead* read);

// After a restore from any tier: drops the holders' copies of steps after `step` (a timeline the
// restart left behind). Best effort.
void TrimPeerCopies(const PeerTier& t, int64_t step);

}  // namespace keel::train
