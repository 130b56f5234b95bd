#include "keel/core/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace keel {

void* AllocHostAligned(size_t bytes) {
  // The size stays the 64-byte multiple the planner counts (glibc takes any size with a larger
  // alignment); an mmap-sized block's skipped lead to the boundary is never touched, so never
  // resident.
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t size = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(bytes >= kHuge ? kHuge : 64, size ? size : 64);
  if (!p) throw std::bad_alloc();
  if (bytes >= kHuge) ::madvise(p, size, MADV_HUGEPAGE);  // advice: its failure changes nothing
  return p;
}

namespace {

class Host final : public Memory {
 public:
  bool host_visible() const override { return true; }
  void* Alloc(size_t bytes) const override { return AllocHostAligned(bytes); }
  void Free(void* p) const override { std::free(p); }
  void Zero(void* p, size_t bytes) const override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void FromHost(void* dst, const void* host, size_t bytes) const override {
    if (bytes) std::memcpy(dst, host, bytes);
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(host, src, bytes);
  }
};

}  // namespace

const Memory& HostMemory() {
  static const Host host;
  return host;
}

}  // namespace keel
