// The asynchronous, atomic checkpoint writer of one rank.
//
// A save goes through phases on a writer thread, so that training only waits for the first:
//   1. snapshot: this rank's slice of the state is copied into a staging buffer (the trainer must
//      not change the state until WaitSnapshot() returns, i.e. before its next optimizer step);
//   2. write: the slice goes to step_N.tmp/rank_RRRRR.bin with an xxh3 per piece, fsynced, and a
//      small sidecar lists the pieces;
//   3. commit (rank 0, once every rank has written; the trainer agrees on that over the
//      communicator): manifest.json, then COMMIT holding the manifest's hash, every file and the
//      folder fsynced, step_N.tmp renamed to step_N, `latest` replaced by atomic rename, and
//      retention applied to older checkpoints.
// A crash at any instant leaves `latest` on a committed checkpoint: nothing before the rename is
// visible as a checkpoint, and `latest` moves only after the rename.
//
//   CheckpointWriter w(run_dir + "/checkpoints", rank, world, {3, 0});
//   w.Begin(view);                // returns at once
//   double blocked = w.WaitSnapshot();
//   ... if (every rank's w.status() == kWritten) on rank 0: w.Commit(); ...
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "keel/ckpt/manifest.h"
#include "keel/ckpt/peer_client.h"
#include "keel/ckpt/state.h"
#include "keel/core/memory.h"

namespace keel::ckpt {

struct Retention {
  int keep_last = 3;   // the newest K committed checkpoints stay
  int keep_every = 0;  // and every one whose step is a multiple of M (0 = none)
};

// Where a tier-0 copy goes instead of the shared folder: holders' memory (peer_client.h).
struct PeerTarget {
  std::string run;                     // the run's name in the holders
  std::vector<peer::Address> holders;  // this host's, then the buddy host's
  double rate_mbit = 0;                // 0: as fast as the link goes
};

// One finished save, for the log, events.jsonl and metrics.
struct SaveReport {
  int64_t step = 0;
  std::vector<std::string> holders;  // a tier-0 copy's (empty: the shared folder's save)
  std::string path;                  // the committed folder, or the .tmp one when it failed
  uint64_t bytes = 0;                // this rank's bytes
  uint64_t total_bytes = 0;          // every rank's (known to rank 0 after the commit)
  uint64_t referenced_bytes = 0;  // this rank's unchanged bytes, referenced in an older checkpoint
  double snapshot_ms = 0;         // the copy the step waited for
  double write_ms = 0;            // write + fsync of this rank's file
  double total_ms = 0;            // Begin to commit (rank 0) or to written (others)
  // Where the writer thread's time went: its CPU time in user space (the staging copy, xxh3) and
  // in the kernel (write: the copy into the page cache), and the wait in fsync (the disk).
  double user_ms = 0, sys_ms = 0, fsync_ms = 0;
  bool direct_io = false;    // the file went out with O_DIRECT
  bool handed_over = false;  // a tier-0 copy's own-host holder read it from the staging memfd
  std::vector<std::string> deleted;  // by retention
  std::string error;                 // empty when it succeeded
  // Committed, but naming it `latest` or applying retention failed (rank 0): said, not undone.
  std::string warning;
};

// Frees a writer's staging buffer: plain memory, or a memfd's mapping
// (CheckpointWriter::ShareStaging).
struct StagingDeleter {
  size_t mapped = 0;  // bytes of a memfd's mapping (unmapped, the memfd closed); 0: free()
  int fd = -1;
  void operator()(uint8_t* p) const;
};

class CheckpointWriter {
 public:
  enum Status { kIdle = 0, kWritten = 0, kWriting = 1, kFailed = 2 };

  // `nice` (0..19) lowers the writer thread's priority, so that its CPU time (the staging copy,
  // hashing, the kernel's copy into the page cache) comes from what the step leaves idle.
  // `direct_io`: write the rank's file with O_DIRECT where the file system takes it.
  // `state_memory`: where the state's buffers live; the snapshot copies them from there into the
  // (pinned, on a GPU) host staging buffer.
  CheckpointWriter(std::string root, int rank, int world, Retention retention, int nice = 0,
                   bool direct_io = true, const Memory& state_memory = HostMemory());
  ~CheckpointWriter();  // finishes what is queued
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Allocates and touches the staging buffer for saves of states shaped like `view` on the writer
  // thread, so that the first save's snapshot is a plain copy rather than a page fault per 4 KiB
  // (measured: 1.4 GB staged in 7.0 s cold, 0.5 s warm). Costs this rank's share of the state in
  // memory (12 bytes per parameter / ranks) for the whole run.
  void Prepare(const StateView& view);
  // Staging in a memfd rather than plain memory (before the first Prepare or Begin): a tier-0
  // copy to this host's holder then goes by descriptor (peer::Client::PutLocal), read once by the
  // holder, instead of through a loopback socket's two kernel copies.
  void ShareStaging() { share_staging_ = true; }
  // After a resume from the committed checkpoint `dir_name` (a step_N of root): its pieces may be
  // referenced by the next save, so incremental saves go on across restarts.
  void Seed(const Manifest& m, const std::string& dir_name);
  // Starts a save of `view` (its buffers must stay alive, and unchanged until WaitSnapshot).
  // Only one save may be in flight: the caller waits for or skips behind the previous one.
  // With `peer`, the save is a tier-0 copy: the same snapshot, sent to holders instead of written
  // (no commit; complete when every rank's part is in, which a restart checks).
  void Begin(StateView view, std::optional<PeerTarget> peer = std::nullopt);
  // Blocks until the snapshot of the current save is taken; returns the milliseconds blocked.
  double WaitSnapshot();
  // This rank's part of the save in flight: writing, written (also when idle), or failed.
  Status status();
  // Blocks until this rank's part is no longer writing (written or failed).
  Status WaitWritten();
  // Rank 0, after every rank has written: commits on the writer thread. Others may call it too;
  // it only finishes their part.
  void Commit();
  // Every rank, when some rank failed: removes this rank's file (rank 0: the whole .tmp folder).
  void Abort();
  // Blocks until every queued task is done; true if there is no save in flight.
  void Drain();
  bool in_flight();
  // Reports of saves finished since the last call (committed, or failed and aborted).
  std::vector<SaveReport> TakeReports();

  const std::string& root() const { return root_; }

 private:
  void Run();
  void Post(std::function<void()> task);
  void DoSnapshot(const StateView& view);
  void CopyChunks();  // takes chunks until none is left
  void DoWrite();
  void DoSend(const PeerTarget& t);
  void ReleaseSources();
  void DoCommit();
  void DoAbort();
  void Fail(const std::string& what);

  const std::string root_;
  const int rank_, world_;
  const Retention retention_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false, stop_ = false;
  bool snapshot_done_ = true, in_flight_ = false;
  bool chunks_ready_ = false;     // chunks_ is set and may be copied by anyone
  bool sources_released_ = true;  // DoWrite has read every deferred piece (or there is none)
  Status status_ = kWritten;
  std::vector<SaveReport> reports_;

  // Touched by the writer thread only, between Begin and commit/abort.
  StateView meta_;  // the view without its buffers' bytes
  void EnsureStaging(size_t bytes);
  int staging_fd() const { return staging_.get_deleter().fd; }
  const Memory* mem_;
  bool share_staging_ = false;
  std::unique_ptr<uint8_t, StagingDeleter> staging_;
  size_t staging_bytes_ = 0;
  struct Chunk {
    const uint8_t* src;
    uint8_t* dst;
    size_t n;            // bytes staged
    bool widen = false;  // src holds n / 4 bf16 values, staged as fp32
  };
  // Pieces of buffers that are not in memory (FlatBuffer::read: an offload tier) are not staged,
  // for want of the memory: DoWrite reads them piece by piece as it writes them, and the state
  // is held until then (WaitSnapshot also waits for sources_released_).
  struct Deferred {
    int source;    // -1: staged
    size_t at, n;  // elements
    bool widen;
  };
  std::vector<std::function<void(size_t, size_t, void*)>> sources_;
  std::vector<Deferred> deferred_;  // by piece, in the sidecar's order
  // StateView::own, copied by Begin on the caller's thread: a rank's own state may change before
  // its next update (the int8 residual changes in the next backward), which the snapshot does not
  // wait for.
  std::vector<std::vector<float>> own_copies_;
  // Reads a deferred piece from its source in slices, widened where bf16, into `fd` (at its
  // current position) and returns its PieceHash.
  uint64_t WriteDeferred(int fd, const Deferred& d, const nlohmann::json& piece,
                         const std::string& path);
  std::vector<Chunk> chunks_;  // the snapshot's copies, in pieces of at most 8 MiB
  std::atomic<size_t> next_chunk_{0}, copied_bytes_{0};
  size_t staged_bytes_ = 0;
  SaveReport current_;
  double begin_ms_ = 0;
  std::string pieces_json_;  // this rank's sidecar, as text
  // This rank's pieces of the last committed save, by tensor, kind and box: where their bytes
  // lie (relative to root_) and their hash, so that an unchanged piece is referenced, not
  // rewritten. next_prev_ is the save in flight's, promoted when it commits.
  struct Stored {
    std::string file;  // "step_00000010/rank_00000.bin"
    uint64_t offset = 0, bytes = 0, xxh3 = 0;
  };
  std::map<std::string, Stored> prev_, next_prev_;

  int nice_ = 0;
  bool direct_io_ = false;
  std::thread thread_;  // last
};

}  // namespace keel::ckpt
