// The snapshot side of the checkpoint writer: the staging buffer, the copy of the state into it
// (shared with the trainer's threads when it falls behind), and bf16's widening on the way.
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/fault.h"
#include "keel/ckpt/writer.h"
#include "keel/ckpt/writer_internal.h"
#include "keel/core/error.h"
#include "keel/core/timer.h"
#include "keel/parallel/dims.h"

namespace keel::ckpt {
using nlohmann::json;

// n bf16 values at the start of `p` (the staging buffer) widened to fp32 in place, last first:
// element i's four bytes cover only bf16 elements at or after i, already read.
void WidenInPlace(uint8_t* p, size_t n) {
  for (size_t i = n; i-- > 0;) {
    bf16 x;
    // host: staging; bytes, not typed pointers, since the two views alias
    std::memcpy(&x, p + 2 * i, 2);
    const float f = ToFloat(x);
    std::memcpy(p + 4 * i, &f, 4);
  }
}

// This thread's CPU time so far, user and kernel, in ms.
std::pair<double, double> ThreadCpuMs() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  auto ms = [](const timeval& t) { return double(t.tv_sec) * 1e3 + double(t.tv_usec) / 1e3; };
  return {ms(u.ru_utime), ms(u.ru_stime)};
}

namespace {

// This rank's slice of the layout for a save: its ZeRO shard of the flat buffers, the same
// whether it holds only that shard (ZeRO >= 1) or a whole replica (ZeRO 0), so that a save's
// bandwidth grows with the ranks either way.
std::pair<size_t, size_t> WriteRangeOf(const StateView& view, int rank, int world) {
  size_t total = 0;
  for (const TensorSpec& t : view.tensors) total = std::max(total, t.offset + size_t(t.numel()));
  const parallel::ShardRange s = view.part >= 0 ? parallel::Shard(total, view.parts, view.part)
                                                : parallel::Shard(total, world, rank);
  return {s.lo, s.hi};
}

}  // namespace

void StagingDeleter::operator()(uint8_t* p) const {
  if (mapped == 0) return std::free(p);
  ::munmap(p, mapped);
  ::close(fd);
}

void CheckpointWriter::EnsureStaging(size_t bytes) {
  if (staging_bytes_ >= bytes) return;
  // In whole huge pages (AllocHostAligned): the copy then faults once per 2 MiB instead of per
  // 4 KiB.
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  if (staging_) mem_->UnpinHost(staging_.get());
  staging_.reset();  // unpinned: released before the larger one, and never unpinned twice
  staging_bytes_ = 0;
  // host: staging is host memory by design (the file's bytes), pinned for the device's copies.
  if (share_staging_) {
    const int fd = ::memfd_create("keel-checkpoint-staging", MFD_CLOEXEC);
    void* p = fd < 0 || ::ftruncate(fd, off_t(size)) != 0
                  ? MAP_FAILED
                  : ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      throw Error(ExitCode::kRuntime, "checkpoint staging: cannot map a memfd of " +
                                          std::to_string(size >> 20) +
                                          " MiB: " + std::strerror(err));
    }
    staging_ = {static_cast<uint8_t*>(p), StagingDeleter{size, fd}};
  } else {
    try {
      staging_ = {static_cast<uint8_t*>(AllocHostAligned(size)), StagingDeleter{}};
    } catch (const std::bad_alloc&) {
      throw Error(ExitCode::kRuntime,
                  "checkpoint staging: cannot allocate " + std::to_string(size >> 20) + " MiB");
    }
  }
  std::memset(staging_.get(), 0, size);  // host: touches the pages (see Prepare)
  mem_->PinHost(staging_.get(), size);
  staging_bytes_ = size;
}

void CheckpointWriter::Prepare(const StateView& view) {
  size_t bytes = 0;
  const auto [lo, hi] = WriteRangeOf(view, rank_, world_);
  const size_t staged = size_t(std::count_if(view.buffers.begin(), view.buffers.end(),
                                             [](const FlatBuffer& b) { return b.data; }));
  for (const TensorSpec& t : view.tensors)
    if (!t.replica)
      for (const Box& b : TensorBoxesIn(t, lo, hi)) bytes += b.numel * 4 * staged;
  for (const OwnBuffer& o : view.own) bytes += 4 * o.n;
  Post([this, bytes] {
    try {
      EnsureStaging(bytes);
    } catch (const std::exception&) {
      // Not fatal here: the first save tries again and reports it.
    }
  });
}

void CheckpointWriter::DoSnapshot(const StateView& view) {
  Timer t;
  const auto cpu0 = ThreadCpuMs();
  current_ = SaveReport{};
  current_.step = view.step;
  const std::string tmp = root_ + "/" + StepDirName(view.step) + ".tmp";
  current_.path = tmp;
  meta_ = view;
  meta_.buffers.clear();  // the bytes are in staging from here on
  for (const auto& b : view.buffers) meta_.buffers.push_back({b.kind, nullptr, b.dtype});

  // This rank's pieces, in staging order: tensor by tensor, kind by kind.
  json pieces = json::array();
  size_t bytes = 0;
  struct Copy {
    const uint8_t* src;
    size_t n;  // elements
    bool widen;
  };
  std::vector<Copy> copies;
  sources_.clear();
  deferred_.clear();
  std::vector<int> source_of;
  for (const FlatBuffer& b : view.buffers) {
    source_of.push_back(b.data ? -1 : int(sources_.size()));
    if (!b.data) {
      KEEL_CHECK(b.read && mem_->host_visible(),
                 "CheckpointWriter: a buffer with no bytes to read");
      sources_.push_back(b.read);
    }
  }
  const auto [lo, hi] = WriteRangeOf(view, rank_, world_);
  for (const TensorSpec& t : view.tensors) {
    if (t.replica) continue;
    for (const Box& box : TensorBoxesIn(t, lo, hi)) {
      const size_t n = box.numel;
      for (size_t i = 0; i < view.buffers.size(); ++i) {
        const FlatBuffer& b = view.buffers[i];
        const size_t eb = DTypeSize(b.dtype), at = t.offset + box.flat - view.lo;
        const bool widen = b.dtype == DType::kBF16;
        deferred_.push_back({source_of[i], at, n, widen});
        pieces.push_back({{"name", t.name},
                          {"kind", b.kind},
                          {"shape", t.shape},
                          {"offset", bytes},
                          {"bytes", n * 4},
                          {"start", box.start},
                          {"count", box.count}});
        if (source_of[i] >= 0) continue;  // read as it is written (DoWrite)
        copies.push_back({static_cast<const uint8_t*>(b.data) + eb * at, n, widen});
        bytes += n * 4;
      }
    }
  }
  for (const OwnBuffer& o : view.own) {
    deferred_.push_back({-1, 0, o.n, false});
    pieces.push_back({{"name", o.name},
                      {"kind", kOwnKind},
                      {"shape", {o.n}},
                      {"offset", bytes},
                      {"bytes", o.n * 4},
                      {"start", {0}},
                      {"count", {o.n}}});
    copies.push_back({reinterpret_cast<const uint8_t*>(o.data), o.n, false});
    bytes += o.n * 4;
  }
  meta_.own.clear();  // staged too; the commit finds them in the ranks' pieces
  EnsureStaging(bytes);
  // Chunks that the trainer's threads can take too (WaitSnapshot), if it gets there first.
  constexpr size_t kChunk = size_t(8) << 20;
  chunks_.clear();
  uint8_t* dst = staging_.get();
  for (const Copy& c : copies) {
    // A bf16 chunk reads half the bytes it stages (kChunk is a multiple of 4).
    for (size_t off = 0; off < c.n * 4; off += kChunk)
      chunks_.push_back(
          {c.src + (c.widen ? off / 2 : off), dst + off, std::min(kChunk, c.n * 4 - off), c.widen});
    dst += c.n * 4;
  }
  next_chunk_ = 0;
  copied_bytes_ = 0;
  if (!mem_->host_visible()) {
    // A GPU's state: one batch of asynchronous copies into the pinned staging buffer, ordered
    // after the step's kernels and overlapping the next step's forward and backward (which leave
    // the state alone); the trainer's threads have nothing to help with.
    void* stream = mem_->CopyStream();
    for (const Chunk& c : chunks_) mem_->ToHostAsync(c.dst, c.src, c.widen ? c.n / 2 : c.n, stream);
    mem_->WaitCopies(stream);
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < chunks_.size(); ++i)
      if (chunks_[i].widen) WidenInPlace(chunks_[i].dst, chunks_[i].n / 4);
    copied_bytes_ = bytes;
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      chunks_ready_ = true;
    }
    cv_.notify_all();
    CopyChunks();
    while (copied_bytes_.load() < bytes) std::this_thread::yield();  // a helper's last chunk
  }
  staged_bytes_ = bytes;
  pieces_json_ = pieces.dump();
  const auto [user, sys] = ThreadCpuMs();
  current_.user_ms = user - cpu0.first;
  current_.sys_ms = sys - cpu0.second;
  current_.bytes = bytes;
  current_.snapshot_ms = t.Millis();
  MaybeCrash("snapshot");
}

void CheckpointWriter::CopyChunks() {
  for (size_t i; (i = next_chunk_.fetch_add(1)) < chunks_.size();) {
    const Chunk& c = chunks_[i];
    if (!c.widen) {
      mem_->ToHost(c.dst, c.src, c.n);
    } else if (mem_->host_visible()) {
      ConvertBf16ToF32(reinterpret_cast<float*>(c.dst), reinterpret_cast<const bf16*>(c.src),
                       c.n / 4);
    } else {
      mem_->ToHost(c.dst, c.src, c.n / 2);
      WidenInPlace(c.dst, c.n / 4);
    }
    copied_bytes_.fetch_add(c.n);
  }
}

}  // namespace keel::ckpt
