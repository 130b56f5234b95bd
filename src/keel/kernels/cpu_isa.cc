#include "keel/kernels/cpu_isa.h"

#include <omp.h>
#include <strings.h>

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "keel/core/cpu_rates.h"
#include "keel/core/error.h"
#include "keel/kernels/backend.h"

// Each ISA's copy of kernels/cpu (CMake's keel_kernels_<isa>); see kernels/cpu/isa.h. Declared
// here rather than through backend_cpu.h, which names only the copy of the including file.
namespace keel::kernels::cpu {
namespace isa_sse42 {
const Backend& CpuBackend();
}
#if defined(KEEL_KERNELS_AVX2)
namespace isa_avx2 {
const Backend& CpuBackend();
}
#endif
#if defined(KEEL_KERNELS_AVX512)
namespace isa_avx512 {
const Backend& CpuBackend();
}
#endif
}  // namespace keel::kernels::cpu

namespace keel::kernels {

const char* IsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kSse42:
      return "x86-64-v2";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool ParseCpuIsa(const std::string& s, CpuIsa* out) {
  if (s == "x86-64-v2" || s == "sse4.2")
    *out = CpuIsa::kSse42;
  else if (s == "avx2" || s == "x86-64-v3")
    *out = CpuIsa::kAvx2;
  else if (s == "avx512" || s == "x86-64-v4")
    *out = CpuIsa::kAvx512;
  else
    return false;
  return true;
}

bool CpuIsaAvailable(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kSse42:
      return true;
#if defined(KEEL_KERNELS_AVX2)
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("x86-64-v3");
#endif
#if defined(KEEL_KERNELS_AVX512)
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("x86-64-v4");
#endif
    default:
      return false;
  }
}

namespace {

CpuIsa Choose() {
  const char* env = std::getenv("KEEL_CPU_ISA");
  if (env && *env) {
    CpuIsa isa;
    if (!ParseCpuIsa(env, &isa))
      ThrowBadInput("KEEL_CPU_ISA=" + std::string(env) + ": expected x86-64-v2, avx2 or avx512");
    if (!CpuIsaAvailable(isa))
      ThrowBadInput("KEEL_CPU_ISA=" + std::string(env) + ": this CPU or this keel has no " +
                    IsaName(isa) + " kernels");
    return isa;
  }
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2})
    if (CpuIsaAvailable(isa)) return isa;
  return CpuIsa::kSse42;
}

std::atomic<int>& Chosen() {
  static std::atomic<int> chosen{int(Choose())};
  return chosen;
}

}  // namespace

CpuIsa ChosenCpuIsa() { return CpuIsa(Chosen().load(std::memory_order_relaxed)); }

void LimitCpuIsa(CpuIsa isa) {
  int now = Chosen().load();
  while (int(isa) < now && !Chosen().compare_exchange_weak(now, int(isa))) {
  }
}

bool Bf16ProductsInFp32() {
  static const bool in_fp32 = [] {
    const char* env = std::getenv("KEEL_BF16_PRODUCTS");
    if (env && *env) {
      const std::string v = env;
      if (v != "native" && v != "fp32")
        ThrowBadInput("KEEL_BF16_PRODUCTS=" + v + ": expected native or fp32");
      return v == "fp32";
    }
    // One thread, 3 runs of 3 ms per loop: the best run of each is the core's rate.
    return MeasurePeakRates(1, 0.003, 3).bf16_in_fp32();
  }();
  return in_fp32;
}

bool ProductsHeldToAvx2() {
  const char* onednn = std::getenv("ONEDNN_MAX_CPU_ISA");
  return ChosenCpuIsa() != CpuIsa::kAvx512 && onednn && strncasecmp(onednn, "avx2", 4) == 0;
}

const Backend& CpuBackendFor(CpuIsa isa) {
  switch (isa) {
#if defined(KEEL_KERNELS_AVX512)
    case CpuIsa::kAvx512:
      return cpu::isa_avx512::CpuBackend();
#endif
#if defined(KEEL_KERNELS_AVX2)
    case CpuIsa::kAvx2:
      return cpu::isa_avx2::CpuBackend();
#endif
    default:
      return cpu::isa_sse42::CpuBackend();
  }
}

namespace {

#if defined(__x86_64__)
constexpr unsigned kFtzDaz = 0x8040;  // MXCSR's flush-to-zero (bit 15), denormals-are-zero (6)
#endif

void FlushHere() {
#if defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | kFtzDaz);
#endif
}

bool FlushedHere() {
#if defined(__x86_64__)
  return (_mm_getcsr() & kFtzDaz) == kFtzDaz;
#else
  return false;
#endif
}

}  // namespace

void FlushDenormals() {
  FlushHere();
#pragma omp parallel
  FlushHere();
}

bool DenormalsFlushed() {
  bool all = FlushedHere();
#pragma omp parallel reduction(&& : all)
  all = all && FlushedHere();
  return all;
}

}  // namespace keel::kernels
