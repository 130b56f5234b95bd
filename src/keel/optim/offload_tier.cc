#include "keel/optim/offload_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "keel/core/error.h"
#include "keel/core/timer.h"
#include "keel/parallel/state_bytes.h"

namespace keel::optim {
namespace {

constexpr uint64_t kBlock = 4096;  // O_DIRECT's alignment of offsets, lengths and buffers
constexpr size_t kBounce = size_t(4) << 20;

uint64_t RoundUp(uint64_t x) { return (x + kBlock - 1) / kBlock * kBlock; }

// host: a bounce buffer for the tier's file, never a model buffer
std::unique_ptr<uint8_t, void (*)(void*)> AlignedBlock(size_t bytes) {
  void* p = std::aligned_alloc(kBlock, std::max<size_t>(kBlock, RoundUp(bytes)));
  if (!p) throw std::bad_alloc();
  return {static_cast<uint8_t*>(p), std::free};
}

// KEEL_OFFLOAD_CRASH_AT=S:K: SIGKILL once chunk K of the S-th update is written back (a crash
// mid-update; both counted from 1, per process).
void MaybeCrash(int stream, size_t chunk) {
  static const std::pair<int, size_t> at = [] {
    const char* e = std::getenv("KEEL_OFFLOAD_CRASH_AT");
    const char* colon = e ? std::strchr(e, ':') : nullptr;
    if (!colon) return std::pair<int, size_t>{0, 0};
    return std::pair<int, size_t>{std::atoi(e), size_t(std::atoll(colon + 1))};
  }();
  if (at.first == stream && at.second == chunk + 1) std::raise(SIGKILL);
}

std::string Where(const std::string& dir) { return "[offload] dir " + dir; }

std::string Mib(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", double(bytes) / 1048576.0);
  return s;
}

}  // namespace

OffloadTier::OffloadTier(const std::string& dir, size_t n, std::vector<int> elem_bytes,
                         size_t chunk_elems, const Memory& mem)
    : dir_(dir),
      n_(n),
      chunk_(chunk_elems),
      chunks_((n + chunk_elems - 1) / chunk_elems),
      eb_(std::move(elem_bytes)),
      mem_(&mem) {
  KEEL_CHECK(chunk_ > 0 && chunk_ % 2048 == 0,
             "OffloadTier: chunk_elems must be a multiple of 2048");
  size_t per_elem = 0;
  for (int b : eb_) {
    base_.push_back(file_bytes_);
    file_bytes_ += RoundUp(uint64_t(n) * uint64_t(b));
    per_elem += size_t(b);
  }
  if (dir.empty()) {
    // host: the host tier's state lives in host memory by design (a GPU's, page-locked)
    try {
      host_ = static_cast<uint8_t*>(AllocHostAligned(std::max<uint64_t>(file_bytes_, 64)));
    } catch (const std::bad_alloc&) {
      ThrowRuntime("[offload] host: cannot allocate " + Mib(file_bytes_) +
                   " of host memory for the optimizer state");
    }
    std::memset(host_, 0, file_bytes_);  // host: the moments start at zero, as in memory
    mem.PinHost(host_, file_bytes_);
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string path = dir + "/.keel-offload-XXXXXX";
  fd_ = ::mkstemp(path.data());
  if (fd_ < 0)
    ThrowBadInput(Where(dir) + ": cannot create the tier's file there (" + std::strerror(errno) +
                  ")");
  ::unlink(path.c_str());  // scratch: gone with the process, whatever way it ends
  if (const int e = ::posix_fallocate(fd_, 0, off_t(file_bytes_))) {
    ::close(fd_);
    ThrowRuntime(Where(dir) + ": no room for the optimizer state's " + Mib(file_bytes_) + " (" +
                 std::strerror(e) + "); free space there or point [offload] dir elsewhere");
  }
  KEEL_CHECK(mem.host_visible(), "OffloadTier: the chunk buffers must be host memory");
  buffers_ = Buffer(mem, parallel::OffloadBufferBytes(n_, chunk_, per_elem));
  const uintptr_t at = reinterpret_cast<uintptr_t>(buffers_.data());
  uint8_t* base = buffers_.as<uint8_t>() + (RoundUp(at) - at);
  for (size_t i = 0; i < std::min<size_t>(3, chunks_); ++i)
    slots_[i].data = base + i * chunk_ * per_elem;  // each region of it block-aligned
  // O_DIRECT keeps the state out of the page cache (which would hold it in memory again); a file
  // system that refuses it (tmpfs) gets buffered I/O.
  const int flags = ::fcntl(fd_, F_GETFL);
  direct_ = ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;
  if (direct_ && n_ > 0) {  // into the first buffer: aligned, and no allocation of its own
    if (::pread(fd_, slots_[0].data, kBlock, 0) < 0 && errno == EINVAL) {
      ::fcntl(fd_, F_SETFL, flags);
      direct_ = false;
    }
  }
  io_ = std::thread([this] { Loop(); });
}

OffloadTier::~OffloadTier() {
  if (host_) {
    mem_->UnpinHost(host_);
    std::free(host_);  // host: AllocHostAligned's block
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  io_.join();
  ::close(fd_);
}

TierStats OffloadTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void OffloadTier::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Timer t;
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.io_ms += t.Millis();
      if (err && !error_) error_ = err;
      ++done_;
    }
    cv_.notify_all();
  }
}

uint64_t OffloadTier::Submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return ++submitted_;
}

void OffloadTier::Wait(uint64_t job) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= job || error_; });
  if (error_) std::rethrow_exception(error_);  // the tier is unusable from here: the run ends
}

void OffloadTier::Drain() const {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = submitted_;
  }
  Wait(last);
}

void OffloadTier::Pread(uint8_t* dst, size_t bytes, uint64_t at) const {
  for (size_t got = 0; got < bytes;) {
    const ssize_t r = ::pread(fd_, dst + got, bytes - got, off_t(at + got));
    if (r <= 0)
      ThrowRuntime(Where(dir_) + ": reading the optimizer state at byte " +
                   std::to_string(at + got) + " failed (" +
                   (r == 0 ? std::string("end of file") : std::strerror(errno)) + ")");
    got += size_t(r);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.read_bytes += double(bytes);
}

void OffloadTier::Pwrite(const uint8_t* src, size_t bytes, uint64_t at) const {
  for (size_t put = 0; put < bytes;) {
    const ssize_t r = ::pwrite(fd_, src + put, bytes - put, off_t(at + put));
    if (r <= 0)
      ThrowRuntime(Where(dir_) + ": writing the optimizer state at byte " +
                   std::to_string(at + put) + " failed (" + std::strerror(errno) + ")");
    put += size_t(r);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.written_bytes += double(bytes);
}

// A chunk's slot holds its regions one after another, each rounded up to whole blocks.
void OffloadTier::ChunkIo(bool write, size_t chunk, Slot& s) {
  const size_t lo = chunk * chunk_, n = std::min(chunk_, n_ - lo);
  uint8_t* p = s.data;
  for (size_t r = 0; r < eb_.size(); ++r) {
    const size_t bytes = RoundUp(uint64_t(n) * uint64_t(eb_[r]));
    if (write)
      Pwrite(p, bytes, At(int(r), lo));
    else
      Pread(p, bytes, At(int(r), lo));
    p += RoundUp(uint64_t(chunk_) * uint64_t(eb_[r]));
  }
  if (write) MaybeCrash(streams_, chunk);
}

void OffloadTier::Prefetch() {
  for (size_t c = 0; c < std::min<size_t>(2, chunks_); ++c)
    slots_[c].ready = Submit([this, c] { ChunkIo(false, c, slots_[c]); });
  prefetched_ = true;
}

void OffloadTier::Stream(const std::function<void(void* const* p, size_t lo, size_t n)>& fn) {
  if (chunks_ == 0) return;
  std::vector<void*> ptrs(eb_.size());
  if (host_) {
    for (size_t lo = 0; lo < n_; lo += chunk_) {
      for (size_t r = 0; r < eb_.size(); ++r) ptrs[r] = host_ + At(int(r), lo);
      fn(ptrs.data(), lo, std::min(chunk_, n_ - lo));
    }
    return;
  }
  if (!prefetched_) Prefetch();
  prefetched_ = false;
  ++streams_;
  for (size_t c = 0; c < chunks_; ++c) {
    Slot& s = slots_[c % 3];
    Timer t;
    Wait(s.ready);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.wait_ms += t.Millis();
    }
    // The slot two ahead held chunk c - 1, whose write-back was queued first: FIFO keeps them in
    // order, so the read cannot overtake it.
    if (c + 2 < chunks_) {
      Slot& next = slots_[(c + 2) % 3];
      next.ready = Submit([this, c, &next] { ChunkIo(false, c + 2, next); });
    }
    uint8_t* p = s.data;
    for (size_t r = 0; r < eb_.size(); ++r) {
      ptrs[r] = p;
      p += RoundUp(uint64_t(chunk_) * uint64_t(eb_[r]));
    }
    const size_t lo = c * chunk_;
    fn(ptrs.data(), lo, std::min(chunk_, n_ - lo));
    Submit([this, c, &s] { ChunkIo(true, c, s); });
  }
  Prefetch();  // the next step's first chunks, read behind its forward and backward
}

void OffloadTier::Read(int region, size_t lo, size_t n, void* dst) const {
  KEEL_CHECK(lo + n <= n_, "OffloadTier::Read past the region's end");
  // host: the host tier's block to the caller's host memory
  if (host_) return void(std::memcpy(dst, host_ + At(region, lo), n * size_t(eb_[size_t(region)])));
  Drain();
  ReadThrough(AlignedBlock(kBounce).get(), region, lo, n, dst);
}

uint64_t OffloadTier::ReadAsync(int region, size_t lo, size_t n, void* dst) {
  KEEL_CHECK(lo + n <= n_, "OffloadTier::ReadAsync past the region's end");
  if (host_) {
    // host: the host tier's block to the caller's host memory
    std::memcpy(dst, host_ + At(region, lo), n * size_t(eb_[size_t(region)]));
    return 0;
  }
  if (!io_bounce_) io_bounce_ = AlignedBlock(kBounce);  // used by the I/O thread alone
  return Submit([this, region, lo, n, dst] { ReadThrough(io_bounce_.get(), region, lo, n, dst); });
}

void OffloadTier::ReadThrough(uint8_t* bounce, int region, size_t lo, size_t n, void* dst) const {
  const uint64_t a = At(region, lo), b = a + uint64_t(n) * uint64_t(eb_[size_t(region)]);
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t at = a / kBlock * kBlock; at < b; at += kBounce) {
    const uint64_t end = std::min<uint64_t>(at + kBounce, RoundUp(b));
    Pread(bounce, size_t(end - at), at);
    const uint64_t from = std::max(at, a), to = std::min(end, b);
    // host: the tier's bounce buffer to the caller's host memory
    std::memcpy(out + (from - a), bounce + (from - at), size_t(to - from));
  }
}

void OffloadTier::Write(int region, size_t lo, size_t n, const void* src) {
  KEEL_CHECK(lo + n <= n_, "OffloadTier::Write past the region's end");
  // host: the caller's host memory into the host tier's block
  if (host_) return void(std::memcpy(host_ + At(region, lo), src, n * size_t(eb_[size_t(region)])));
  Drain();
  prefetched_ = false;  // what was read ahead may be what this changes
  const uint64_t a = At(region, lo), b = a + uint64_t(n) * uint64_t(eb_[size_t(region)]);
  auto bounce = AlignedBlock(kBounce);
  const auto* in = static_cast<const uint8_t*>(src);
  for (uint64_t at = a / kBlock * kBlock; at < b; at += kBounce) {
    const uint64_t end = std::min<uint64_t>(at + kBounce, RoundUp(b));
    const uint64_t from = std::max(at, a), to = std::min(end, b);
    // A block the range covers in part keeps the bytes around it.
    if (from > at || to < end) Pread(bounce.get(), size_t(end - at), at);
    // host: the caller's host memory into the tier's bounce buffer
    std::memcpy(bounce.get() + (from - at), in + (from - a), size_t(to - from));
    Pwrite(bounce.get(), size_t(end - at), at);
  }
}

}  // namespace keel::optim
