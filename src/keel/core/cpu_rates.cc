// The loops behind cpu_rates.h. Each keeps 16 independent accumulator chains (12 on 256-bit
// registers, 4 tiles for AMX) so that latency and the issue ports are covered; the rate is taken
// over each thread's CPU time so that other load on the machine does not lower it.
#include "keel/core/cpu_rates.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <thread>
#include <vector>

namespace keel {

namespace {

constexpr int kAcc = 16;       // independent accumulators: covers latency x ports with room
constexpr long kInner = 4096;  // iterations between clock reads

// Keeps the accumulators alive.
__attribute__((target("avx512f"))) void Sink(const __m512* acc, float* sink) {
  alignas(64) float lanes[16];
  __m512 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, acc[i]);
  _mm512_store_ps(lanes, s);
  for (float f : lanes) *sink += f;
}

// This thread's CPU time, so that a busy machine does not lower the figure.
double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Returns FLOPs done per second of this thread's CPU time.
__attribute__((target("avx512f"))) double FmaLoop(double seconds, float* sink) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  long iters = 0;
  const double c0 = ThreadSeconds();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (long n = 0; n < kInner; ++n)
      for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    iters += kInner;
  }
  Sink(acc, sink);
  return double(iters) * kAcc * 16 * 2 / (ThreadSeconds() - c0);
}

// The same FMA loop on 256-bit registers, for CPUs without AVX-512 (AVX2 + FMA: 16 FLOP each).
// 12 chains: 16 ymm registers hold them and the two operands without spilling, and 12 cover the
// 4-5 cycle latency on two FMA ports.
__attribute__((target("avx2,fma"))) double FmaLoop256(double seconds, float* sink) {
  constexpr int kAcc256 = 12;
  __m256 acc[kAcc256];
  for (int i = 0; i < kAcc256; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  long iters = 0;
  const double c0 = ThreadSeconds();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (long n = 0; n < kInner; ++n)
      for (int i = 0; i < kAcc256; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    iters += kInner;
  }
  alignas(32) float lanes[8];
  __m256 s = acc[0];
  for (int i = 1; i < kAcc256; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(lanes, s);
  for (float f : lanes) *sink += f;
  return double(iters) * kAcc256 * 8 * 2 / (ThreadSeconds() - c0);
}

__attribute__((target("avx512f,avx512bf16"))) double DpbfLoop(double seconds, float* sink) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  long iters = 0;
  const double c0 = ThreadSeconds();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (long n = 0; n < kInner; ++n)
      for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    iters += kInner;
  }
  Sink(acc, sink);
  return double(iters) * kAcc * 32 * 2 / (ThreadSeconds() - c0);
}

// AMX: 4 independent 16x16 fp32 accumulator tiles, each tdpbf16ps 16*16*32*2 FLOP. Linux must grant
// the tile data state first (arch_prctl ARCH_REQ_XCOMP_PERM); returns 0 FLOP/s if it does not.
__attribute__((target("amx-tile,amx-bf16"))) double AmxLoop(double seconds, float* sink) {
  if (syscall(SYS_arch_prctl, 0x1023 /*ARCH_REQ_XCOMP_PERM*/, 18 /*XFEATURE_XTILEDATA*/) != 0)
    return 0;
  alignas(64) unsigned char cfg[64] = {1};  // palette 1; 8 tiles of 16 rows x 64 bytes
  for (int t = 0; t < 8; ++t) cfg[16 + 2 * t] = 64, cfg[48 + t] = 16;
  _tile_loadconfig(cfg);
  alignas(64) static thread_local uint16_t data[16 * 32];
  for (auto& x : data) x = 0x3c00;  // a small bf16
  _tile_loadd(4, data, 64);
  _tile_loadd(5, data, 64);
  _tile_loadd(6, data, 64);
  _tile_loadd(7, data, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  long iters = 0;
  const double c0 = ThreadSeconds();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (long n = 0; n < kInner / 16; ++n) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    iters += kInner / 16;
  }
  const double rate = double(iters) * 4 * 16 * 16 * 32 * 2 / (ThreadSeconds() - c0);
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  *sink = out[0];
  return rate;
}

// Best of `reps` runs of `loop` on `threads` threads at once; returns the summed FLOP/s, each
// thread's rate taken over its own CPU time.
double Measure(double (*loop)(double, float*), int threads, double seconds, int reps) {
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<double> rate(threads);
    std::vector<float> sink(threads);
    std::vector<std::thread> pool;
    pool.reserve(size_t(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { rate[t] = loop(seconds, &sink[t]); });
    for (auto& th : pool) th.join();
    double total = 0;
    for (double r : rate) total += r;
    best = std::max(best, total);
  }
  return best;
}

}  // namespace

PeakRates MeasurePeakRates(int threads, double seconds, int reps) {
  threads = std::max(1, threads);
  reps = std::max(1, reps);
  __builtin_cpu_init();
  PeakRates r;
  if (!__builtin_cpu_supports("avx512f")) {
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      r.fp32_fma = r.fp32_fma256 = Measure(FmaLoop256, threads, seconds, reps);
      r.fma_bits = 256;
    }
    return r;  // no AVX-512: no vdpbf16ps and no AMX either
  }
  r.fp32_fma = Measure(FmaLoop, threads, seconds, reps);
  r.fma_bits = 512;
  r.fp32_fma256 = Measure(FmaLoop256, threads, seconds, reps);
  if (__builtin_cpu_supports("avx512bf16"))
    r.bf16_dpbf16 = Measure(DpbfLoop, threads, seconds, reps);
  unsigned a, b, c, d;
  const bool amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
  if (amx) r.amx_bf16 = Measure(AmxLoop, threads, seconds, reps);
  return r;
}

}  // namespace keel
