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

// Runs the checks here and returns {"host", "ok", "problems": [...], "device", "matmul_gflops",
// "matmul_max_error", "free_mem_gb", "free_disk_gb", "build", "seconds"}.
nlohmann::json CheckThisHost(const HealthOptions& o);

}  // namespace keel::resilience
