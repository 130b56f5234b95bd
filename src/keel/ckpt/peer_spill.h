// A tier-0 holder's copies on its host's local disk (`keel holder --spill DIR`): every item it
// takes is also written to DIR/KEY.XXH3 (by rename, so a file is whole or absent), and a holder
// started again on the same host, after the trainer or the holder itself died but the host did
// not, begins with what the folder keeps. Each file's bytes are checked against the hash in its
// name before they are held again; a file that does not match is removed.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace keel::ckpt::peer {

struct SpilledItem {
  std::string key;
  std::string bytes;
  uint64_t xxh3 = 0;
};

class Spill {
 public:
  explicit Spill(std::string dir) : dir_(std::move(dir)) {}
  // What the folder keeps, verified; removes what does not verify and unfinished writes.
  std::vector<SpilledItem> Load();
  void Write(const std::string& key, const std::string& bytes, uint64_t xxh3);
  // Every version of `key`'s file.
  void Remove(const std::string& key);

 private:
  std::string dir_;
  std::mutex mu_;
};

}  // namespace keel::ckpt::peer
