// A run checks the shards it trains on against meta.json's xxh3s, once per process: a flipped
// byte that still decodes to valid token ids would otherwise train silently (`keel data verify`
// finds it, but only when someone runs it).
//
// Hashing reads every byte (xxh3 itself runs at memory speed; the cost is the read: 0.09 s
// per GB from the page cache on the development VM, 11.5 GB/s; a disk's bandwidth otherwise). Up to
// kSyncBytes of shards are checked before the first step; more is checked by a background
// thread while training starts, and the trainer asks after every step: a mismatch then stops the
// run (exit 2, naming the file) within a step of its discovery, after having trained on at most
// the steps it took to find. Flat token files have no recorded hash and are not checked; URL
// datasets are checked as their shards arrive.
//
//   ShardCheck check({"data/brown/train", "data/brown/val"});   // may throw for small data
//   ...each step: check.ThrowIfFailed();
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace keel::train {

class ShardCheck {
 public:
  static constexpr uint64_t kSyncBytes = uint64_t(1) << 30;

  // `paths`: the run's datasets (folders with meta.json are checked; others are skipped). Up to
  // `sync_bytes` in all are checked here (throwing keel::Error, bad input), more in the background.
  explicit ShardCheck(const std::vector<std::string>& paths, uint64_t sync_bytes = kSyncBytes);
  ~ShardCheck();
  ShardCheck(const ShardCheck&) = delete;
  ShardCheck& operator=(const ShardCheck&) = delete;

  // Throws the background check's keel::Error (bad input) once it found a corrupt file.
  void ThrowIfFailed();
  uint64_t bytes() const { return bytes_; }  // the shards' token and index bytes to hash

 private:
  std::vector<std::string> dirs_;
  uint64_t bytes_ = 0;
  std::atomic<bool> stop_{false}, failed_{false};
  std::mutex mu_;
  std::string problem_;
  std::thread thread_;
};

}  // namespace keel::train
