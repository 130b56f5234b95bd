// The tier-0 holder: a process per host (`keel holder`, started by `keel launch`) that keeps the
// checkpoint files ranks send it (peer_client.h) in its own memory, so that they outlive the
// trainer's processes but not the host. Each item arrives whole and checked (xxh3) before it
// replaces anything; of each run's file it keeps the newest `keep` steps, so that a save cut off
// half-way leaves the previous one complete. Ranks of its own host hand their files over by
// descriptor through a local door (peer_socket.h, ListenLocal) rather than send the bytes.
//
//   peer::HolderOptions o{"node2", 29790};
//   peer::RunHolder(o, stop_flag);   // until stop_flag is set
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace keel::ckpt::peer {

struct HolderOptions {
  std::string bind = "127.0.0.1";
  int port = 29790;        // 0: any free port (on_listening says which)
  uint64_t max_bytes = 0;  // 0: no limit; a PUT past it is refused (the sender reports it)
  int keep = 2;            // steps kept per run and file
  std::string spill_dir;  // also on this host's disk, and loaded from there at start (peer_spill.h)
};

// Serves until `stop` is set (checked five times a second) or a client asks it to quit.
// `on_listening` gets the port once the socket listens. Throws keel::Error when it cannot listen.
void RunHolder(const HolderOptions& o, const std::atomic<bool>& stop,
               const std::function<void(int port)>& on_listening = {});

}  // namespace keel::ckpt::peer
