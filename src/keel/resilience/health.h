// The supervisor's health check of one host, run on that host (`keel health`) before every
// (re)start: a small matrix product against its exactly known result and its rate, free memory,
// free disk where checkpoints go, and the keel build. Seconds, not minutes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "keel/kernels/backend.h"

namespace keel::resilience {

struct HealthOptions {
  std::string disk_dir;         // where the run writes checkpoints ("" skips the disk check)
  double min_free_disk_gb = 1;  // below this the host fails
  double min_free_mem_gb = 0;   // 0: no memory floor
  double min_gflops = 0;        // 0: the product's rate is reported, not judged
  kernels::Device device = kernels::Device::kCpu;  // where the product runs
};

// The largest |a·wᵀ - out| over the (M, N) product of a (M, K) and w (N, K), summed in fp64; NaN
// when an element of `out` is NaN, so that a device returning NaN fails the check (std::max
// skips a NaN, which made such a product's error 0).
double LargestProductError(const float* a, const float* w, const float* out, int M, int K, int N);

// Runs the checks here and returns {"host", "ok", "problems": [...], "device", "matmul_gflops",
// "matmul_max_error", "free_mem_gb", "free_disk_gb", "build", "seconds"}.
nlohmann::json CheckThisHost(const HealthOptions& o);

}  // namespace keel::resilience
