#include "keel/resilience/health.h"

#include <sys/statvfs.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "keel/core/host.h"
#include "keel/core/validate.h"
#include "keel/kernels/backend.h"
#include "keel/resilience/build_id.h"

namespace keel::resilience {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Inputs of small integers, so that every product and sum is exact in fp32 (|sum| < 2^24): a
// wrong element is a wrong answer, not rounding. Returns the largest error and the rate.
void CheckMatmul(const kernels::Backend& be, double* max_error, double* gflops) {
  const int M = 256, K = 512, N = 256;
  std::vector<float> a(size_t(M) * K), w(size_t(N) * K), out(size_t(M) * N);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) a[size_t(i) * K + k] = float((i * 7 + k * 3) % 9 - 4);
  for (int j = 0; j < N; ++j)
    for (int k = 0; k < K; ++k) w[size_t(j) * K + k] = float((j * 5 + k) % 7 - 3);
  Buffer da(be, a.size() * sizeof(float)), dw(be, w.size() * sizeof(float)),
      dout(be, out.size() * sizeof(float));
  be.FromHost(da.data(), a.data(), da.bytes());
  be.FromHost(dw.data(), w.data(), dw.bytes());
  be.MatmulForward<float>(dout.as<float>(), da.as<float>(), dw.as<float>(), nullptr, M, K, N);
  be.Synchronize();  // the warm-up (and on a GPU, cuBLASLt's first-call setup) is not timed
  const int reps = 8;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r)
    be.MatmulForward<float>(dout.as<float>(), da.as<float>(), dw.as<float>(), nullptr, M, K, N);
  be.Synchronize();
  *gflops = 2.0 * M * K * N * reps / Seconds(t0) / 1e9;
  be.ToHost(out.data(), dout.data(), dout.bytes());
  *max_error = LargestProductError(a.data(), w.data(), out.data(), M, K, N);
}

}  // namespace

double LargestProductError(const float* a, const float* w, const float* out, int M, int K, int N) {
  double largest = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += double(a[size_t(i) * K + k]) * w[size_t(j) * K + k];
      const double e = std::abs(want - out[size_t(i) * N + j]);
      if (std::isnan(e)) return e;
      largest = std::max(largest, e);
    }
  return largest;
}

nlohmann::json CheckThisHost(const HealthOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  nlohmann::json r = {{"host", HostName()}, {"build", BuildIdentity()}};
  std::vector<std::string> problems;

  // A device that cannot be used here (no plugin, library, driver or GPU) is bad input: one line
  // from kernels::Get, exit 2, as keel train would say it.
  const kernels::Backend& be = kernels::Get(o.device);
  r["device"] = be.name();
  double err = 0, gflops = 0;
  CheckMatmul(be, &err, &gflops);
  r["matmul_max_error"] = err;
  r["matmul_gflops"] = gflops;
  if (!(err == 0))
    problems.push_back("matrix product wrong (largest error " + std::to_string(err) + ")");
  if (o.min_gflops > 0 && gflops < o.min_gflops)
    problems.push_back("matrix product at " + std::to_string(int(gflops)) +
                       " GFLOP/s, below health_min_gflops = " + std::to_string(int(o.min_gflops)));

  const double mem = MemAvailableBytes() > 0 ? MemAvailableBytes() / 1073741824.0 : -1;
  r["free_mem_gb"] = mem;
  if (o.min_free_mem_gb > 0 && mem >= 0 && mem < o.min_free_mem_gb)
    problems.push_back("free memory " + std::to_string(mem).substr(0, 5) + " GB, below " +
                       std::to_string(o.min_free_mem_gb).substr(0, 5));

  if (!o.disk_dir.empty()) {
    // The checkpoint folder may not exist yet: judge the nearest folder above it that does.
    std::filesystem::path p = o.disk_dir;
    std::error_code ec;
    while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
    struct statvfs st;
    if (::statvfs(p.empty() ? "." : p.c_str(), &st) == 0) {
      const double gb = double(st.f_bavail) * double(st.f_frsize) / 1e9;
      r["free_disk_gb"] = gb;
      if (gb < o.min_free_disk_gb)
        problems.push_back(
            "free disk in " + o.disk_dir + " " + std::to_string(gb).substr(0, 5) +
            " GB, below health_min_free_gb = " + std::to_string(o.min_free_disk_gb).substr(0, 5));
    } else {
      problems.push_back("cannot read the free space of " + o.disk_dir);
    }
  }
  r["problems"] = problems;
  r["ok"] = problems.empty();
  r["seconds"] = Seconds(t0);
  return r;
}

}  // namespace keel::resilience
