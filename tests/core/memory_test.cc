// AllocHostAligned (core/memory.h): 64-byte alignment always, a 2 MiB boundary from 2 MiB up (where
// the huge-page advice applies), the whole size writable, and std::free releasing it.
#include "keel/core/memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace keel {
namespace {

constexpr size_t kHuge = size_t(2) << 20;

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(AllocHostAligned, SmallBlocksAre64ByteAligned) {
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(65), size_t(4096), kHuge - 1}) {
    void* p = AllocHostAligned(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(Address(p) % 64, 0u) << bytes;
    std::memset(p, 0xab, bytes);
    std::free(p);
  }
}

TEST(AllocHostAligned, LargeBlocksStartOnA2MiBBoundary) {
  for (size_t bytes : {kHuge, kHuge + 1, 3 * kHuge + 4096}) {
    void* p = AllocHostAligned(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(Address(p) % kHuge, 0u) << bytes;
    auto* c = static_cast<unsigned char*>(p);
    std::memset(c, 0x5a, bytes);
    EXPECT_EQ(c[0], 0x5a);
    EXPECT_EQ(c[bytes - 1], 0x5a);
    std::free(p);
  }
}

TEST(AllocHostAligned, HostMemoryUsesIt) {
  const Memory& mem = HostMemory();
  void* p = mem.Alloc(kHuge + 64);
  EXPECT_EQ(Address(p) % kHuge, 0u);
  mem.Free(p);
}

}  // namespace
}  // namespace keel
