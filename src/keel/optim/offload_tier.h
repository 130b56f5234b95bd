// A disk tier for optimizer state ([offload] dir): regions of n elements each (the fp32 master,
// AdamW's m and v) in one unlinked scratch file, read and written with O_DIRECT where the file
// system takes it, so that the state of a model larger than the machine's memory streams through
// three buffers of one chunk each instead of living in memory.
//
// Stream() is the update's path: chunk after chunk in order, the next ones read and the previous
// ones written back by one I/O thread while the caller computes on the current one. It ends by
// starting to read the first chunks again, which the next step's forward and backward hide.
// Read() and Write() are for everything else (checkpoints, replica checks, loading): any range,
// through a bounce buffer, after the queued I/O has landed.
//
// The host tier ([offload] host, for a GPU's state: `dir` empty) keeps the same regions in one
// block of host memory, page-locked through `mem` so that a GPU's copies to and from it run at
// full speed: Stream hands out pointers into it, Read and Write copy, and there is no file, no
// I/O thread and no chunk buffers.
//
// KEEL_OFFLOAD_CRASH_AT=S:K kills the process (SIGKILL) once the S-th Stream has written chunk K
// back: the crash-mid-update test's fault.
//
//   OffloadTier tier("/nvme/scratch", n, {4, 4, 4}, 16 << 20);
//   tier.Stream([&](void* const* p, size_t lo, size_t n) { /* p[0..2] hold [lo, lo + n) */ });
//   tier.Read(/*region=*/1, lo, n, host);
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "keel/core/memory.h"

namespace keel::optim {

// I/O counters since the tier opened.
struct TierStats {
  double read_bytes = 0, written_bytes = 0;
  double wait_ms = 0;  // time Stream's caller waited for a chunk to arrive
  double io_ms = 0;    // time the I/O thread spent in reads and writes
};

class OffloadTier {
 public:
  // `chunk_elems`: a multiple of 2048 (each region's chunk then starts on a 4 KiB boundary). The
  // chunk buffers come from `mem` (host-visible): parallel::OffloadBufferBytes of it. Reserves the
  // whole file up front: a disk without room for it fails here, with one line naming the folder and
  // the bytes, before the run changes anything.
  // `dir` empty: the host tier (above), pinned through `mem`.
  OffloadTier(const std::string& dir, size_t n, std::vector<int> elem_bytes, size_t chunk_elems,
              const Memory& mem = HostMemory());
  ~OffloadTier();
  OffloadTier(const OffloadTier&) = delete;
  OffloadTier& operator=(const OffloadTier&) = delete;

  size_t size() const { return n_; }
  size_t chunk_elems() const { return chunk_; }
  bool direct() const { return direct_; }  // O_DIRECT (false: the page cache, e.g. tmpfs)
  bool host() const { return host_ != nullptr; }
  // The file's bytes, or the host tier's.
  uint64_t file_bytes() const { return file_bytes_; }
  const std::string& dir() const { return dir_; }
  TierStats stats() const;

  // fn(p, lo, n) for each chunk [lo, lo + n) in order, p[r] its region r in memory; what fn
  // leaves there is written back.
  void Stream(const std::function<void(void* const* p, size_t lo, size_t n)>& fn);
  // Region r's elements [lo, lo + n) to or from host memory. Read may run on several threads at
  // once (the checkpoint writer's); Write may not.
  void Read(int region, size_t lo, size_t n, void* dst) const;
  void Write(int region, size_t lo, size_t n, const void* src);
  // Read on the I/O thread, behind what is queued: returns a ticket for WaitRead, which rethrows
  // what the read threw. `dst` must stay alive and untouched until then. The host tier copies at
  // once (ticket 0).
  uint64_t ReadAsync(int region, size_t lo, size_t n, void* dst);
  void WaitRead(uint64_t ticket) const { Wait(ticket); }

 private:
  struct Slot {
    uint8_t* data = nullptr;
    uint64_t ready = 0;  // the job that fills it
  };
  uint64_t Submit(std::function<void()> job);  // FIFO on the I/O thread; returns its number
  void Wait(uint64_t job) const;               // until it ran; rethrows what it threw
  void Drain() const;                          // until everything queued ran
  void Prefetch();                             // reads of chunks 0 and 1 into slots 0 and 1
  void ChunkIo(bool write, size_t chunk, Slot& s);
  void Pread(uint8_t* dst, size_t bytes, uint64_t at) const;
  void Pwrite(const uint8_t* src, size_t bytes, uint64_t at) const;
  // Region r's [lo, lo + n) into dst through `bounce` (kBounce bytes, block-aligned).
  void ReadThrough(uint8_t* bounce, int region, size_t lo, size_t n, void* dst) const;
  uint64_t At(int region, size_t elem) const {
    return base_[size_t(region)] + elem * eb_[size_t(region)];
  }
  void Loop();

  std::string dir_;
  size_t n_, chunk_, chunks_;
  std::vector<int> eb_;
  std::vector<uint64_t> base_;
  uint64_t file_bytes_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  Buffer buffers_;
  Slot slots_[3];
  bool prefetched_ = false;
  int streams_ = 0;  // Stream calls so far
  const Memory* mem_;
  uint8_t* host_ = nullptr;  // the host tier's block (AllocHostAligned), pinned through mem_
  std::unique_ptr<uint8_t, void (*)(void*)> io_bounce_{nullptr, std::free};  // ReadAsync's

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  mutable TierStats stats_;
  std::thread io_;
};

}  // namespace keel::optim
