// keel health's product check (resilience/health.h): the error it reports is the largest over
// the product, and a NaN anywhere in the device's result makes it NaN, so the host fails the
// check instead of passing with error 0 (std::max skipped the NaN).
#include "keel/resilience/health.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace keel::resilience {
namespace {

TEST(Health, ProductErrorIsTheLargestAndANanMakesItNan) {
  const int M = 3, K = 4, N = 5;
  std::vector<float> a(M * K), w(N * K), out(M * N);
  for (int i = 0; i < M * K; ++i) a[size_t(i)] = float(i % 5 - 2);
  for (int i = 0; i < N * K; ++i) w[size_t(i)] = float(i % 3 - 1);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float sum = 0;
      for (int k = 0; k < K; ++k) sum += a[size_t(i * K + k)] * w[size_t(j * K + k)];
      out[size_t(i * N + j)] = sum;
    }
  EXPECT_EQ(LargestProductError(a.data(), w.data(), out.data(), M, K, N), 0.0);
  out[7] += 2.0f;
  out[3] -= 0.5f;
  EXPECT_EQ(LargestProductError(a.data(), w.data(), out.data(), M, K, N), 2.0);
  out[11] = std::nanf("");
  EXPECT_TRUE(std::isnan(LargestProductError(a.data(), w.data(), out.data(), M, K, N)));
  out[11] = 0;
  out[0] = std::nanf("");  // first, before any error: a NaN still sticks
  EXPECT_TRUE(std::isnan(LargestProductError(a.data(), w.data(), out.data(), M, K, N)));
}

TEST(Health, ThisHostsCpuProductIsExact) {
  const nlohmann::json r = CheckThisHost({});
  EXPECT_EQ(r.at("matmul_max_error").get<double>(), 0.0) << r.dump();
  EXPECT_GT(r.at("matmul_gflops").get<double>(), 0.0) << r.dump();
}

}  // namespace
}  // namespace keel::resilience
