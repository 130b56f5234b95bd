// Helpers for determinism tests: bitwise comparison of buffers and a scoped OpenMP thread count.
//
//   std::vector<float> a = Run(), b;
//   { ScopedNumThreads one(1); b = Run(); }
//   EXPECT_TRUE(BitwiseEqual(a, b));
#pragma once

#include <omp.h>

#include <cstring>
#include <vector>

namespace keel::test {

// Bitwise equality: a determinism test must not hide a reordered sum behind a tolerance.
template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Sets the OpenMP thread count for a scope (omp_set_num_threads is per calling thread).
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedNumThreads() { omp_set_num_threads(saved_); }
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int saved_;
};

}  // namespace keel::test
