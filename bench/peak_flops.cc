// The machine's peak arithmetic rate, measured: a tight loop of independent AVX-512 FMAs
// (vfmadd231ps, 32 FLOP each), one of vdpbf16ps (64 FLOP each) and, where the CPU has AMX, one of
// tdpbf16ps (16384 FLOP each), on 1 thread and on N threads at once (default 2), each thread's
// rate taken over its own CPU time (robust to other load, exact on a quiet machine). MFU in
// bench/train_throughput.sh is taken against these figures.
//
//   build/peak_flops [threads=2] [seconds_per_run=0.3]
// prints one JSON line: fp32_fma_gflops, bf16_dpbf16_gflops, amx_bf16_gflops (0 without AMX), the
// same on one core (*_1core), threads.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

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

// Best of 3 runs of `loop` on `threads` threads at once; returns the summed GFLOP/s, each thread's
// rate taken over its own CPU time.
double Measure(double (*loop)(double, float*), int threads, double seconds) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> rate(threads);
    std::vector<float> sink(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { rate[t] = loop(seconds, &sink[t]); });
    for (auto& th : pool) th.join();
    double total = 0;
    for (double r : rate) total += r;
    best = std::max(best, total / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.3;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
    std::fprintf(stderr, "peak_flops: needs AVX-512F and AVX512-BF16\n");
    return 1;
  }
  unsigned a, b, c, d;
  const bool amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
  const double f1 = Measure(FmaLoop, 1, seconds), fn = Measure(FmaLoop, threads, seconds);
  const double b1 = Measure(DpbfLoop, 1, seconds), bn = Measure(DpbfLoop, threads, seconds);
  const double a1 = amx ? Measure(AmxLoop, 1, seconds) : 0;
  const double an = amx ? Measure(AmxLoop, threads, seconds) : 0;
  std::printf(
      "{\"threads\": %d, \"fp32_fma_gflops\": %.1f, \"bf16_dpbf16_gflops\": %.1f, "
      "\"amx_bf16_gflops\": %.1f, \"fp32_fma_gflops_1core\": %.1f, "
      "\"bf16_dpbf16_gflops_1core\": %.1f, \"amx_bf16_gflops_1core\": %.1f, "
      "\"method\": \"best of 3 x %.2fs per figure; 16 independent zmm vfmadd231ps / vdpbf16ps "
      "chains, 4 independent tdpbf16ps tiles, per thread; FLOPs per thread CPU second, summed\"}\n",
      threads, fn, bn, an, f1, b1, a1, seconds);
  return 0;
}
