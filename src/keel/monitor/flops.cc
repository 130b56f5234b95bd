#include "keel/monitor/flops.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "keel/core/cpu_rates.h"

namespace keel::monitor {
namespace {

std::string CacheDir() {
  if (const char* d = std::getenv("KEEL_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/keel";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/keel";
  return "";
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

nlohmann::json ReadCache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();  // unreadable: measured again
}

// Best effort: a cache that cannot be written costs a second of the next start, nothing else.
void WriteCache(const std::string& dir, const std::string& path, const nlohmann::json& j) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

double TrainFlopsPerToken(double matmul_params, int n_layer, int n_embd, int seq_len) {
  return 6.0 * matmul_params + 12.0 * n_layer * n_embd * double(seq_len);
}

Peak MachinePeak(DType dtype, int threads, double override_gflops, PeakScope scope) {
  if (override_gflops > 0) return {override_gflops * 1e9, "[monitor] peak_gflops"};
  const std::string dir = CacheDir(), path = dir.empty() ? "" : dir + "/peak_flops.json";
  const std::string key = CpuModel() + " | threads " + std::to_string(threads);
  nlohmann::json cache = path.empty() ? nlohmann::json::object() : ReadCache(path);
  const nlohmann::json* entry = nullptr;
  if (auto it = cache.find(key); it != cache.end() && it->is_object() &&
                                 it->value("fp32", 0.0) > 0 && it->contains("bf16") &&
                                 it->contains("fp32_256"))
    entry = &*it;
  std::string source = "measured on this CPU, cached in " + path;
  if (!entry) {
    const PeakRates r = MeasurePeakRates(threads, 0.1, 3);
    cache[key] = {{"fp32", r.fp32_fma},
                  {"fp32_256", r.fp32_fma256},
                  {"bf16", r.bf16()},
                  {"fma_bits", r.fma_bits}};
    entry = &cache[key];
    if (!path.empty()) WriteCache(dir, path, cache);
    source = path.empty() ? "measured on this CPU now (no cache folder)"
                          : "measured on this CPU now, cached in " + path;
  }
  const double fp32 = entry->value("fp32", 0.0), bf16 = entry->value("bf16", 0.0);
  if (fp32 <= 0) return {0, "this CPU has no FMA loop keel can time; set [monitor] peak_gflops"};
  if (scope == PeakScope::kAvx2) {
    const double fp32_256 = entry->value("fp32_256", 0.0);
    if (fp32_256 <= 0) return {0, "this CPU has no AVX2 FMA loop keel can time"};
    return {fp32_256, source + " (AVX2 FMA)"};
  }
  // fp16 products run in fp32 here (kernels/cpu/matmul.cc): the fp32 peak is theirs. bf16 ones
  // run in fp32 too where the bf16 instruction is slower (PeakRates::bf16_products); caches
  // written before that rule hold the instruction's rate, so the larger is taken here.
  return {dtype != DType::kBF16 ? fp32 : std::max(bf16, fp32), source};
}

}  // namespace keel::monitor
