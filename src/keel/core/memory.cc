#include "keel/core/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace keel {
namespace {

class Host final : public Memory {
 public:
  bool host_visible() const override { return true; }
  void* Alloc(size_t bytes) const override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
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
