// A quantized base's dequantization (Backend::Dequantize, into bf16) beside what bounds it and
// what it serves, in one invocation, on one block matrix (default: an 8B Llama's gate and up,
// 28672 x 4096):
//   - its time against its memory roofline: the bytes it must move (codes and scales read, bf16
//     written) at twice the machine's measured memcpy rate (each copied byte is read and written;
//     bench/roofline.h's convention);
//   - its time against the bf16 product it precedes, x (M, cols) · Wᵀ, for M = B·T rows: what a
//     quantized base adds to each of the forward's and the backward's products of this matrix.
//
//   build/dequant_bench [ROWS] [COLS] [REPS]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "best_ms.h"
#include "keel/core/memory.h"
#include "keel/core/rng.h"
#include "keel/kernels/backend.h"
#include "keel/model/quantize.h"
#include "keel/monitor/machine_probe.h"

using namespace keel;
using keel::bench::BestMs;

int main(int argc, char** argv) {
  const size_t rows = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 28672;
  const size_t cols = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 4096;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const size_t n = rows * cols;
  const kernels::Backend& be = kernels::Cpu();
  std::vector<float> w(n);
  const Philox rng(7, 0);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) w[i] = 0.02f * rng.Normal(i);
  const double bandwidth =
      2 * monitor::MeasureCopyRate(omp_get_max_threads(), size_t(192) << 20, 5);
  std::printf("matrix %zu x %zu, %d threads, memory %.1f GB/s (2 x memcpy)\n", rows, cols,
              omp_get_max_threads(), bandwidth / 1e9);
  std::vector<bf16> out(n);
  for (model::BaseQuant q : {model::BaseQuant::kInt8, model::BaseQuant::kNf4}) {
    const size_t group = model::QuantGroup(q, cols);
    std::vector<uint8_t> codes(model::QuantCodeBytes(q, n));
    std::vector<float> scales(n / group);
    model::Quantize(q, w.data(), rows, cols, codes.data(), scales.data());
    const double ms = BestMs(reps, [&] {
      be.Dequantize(out.data(), codes.data(), scales.data(), n, group, model::FormatOf(q));
    });
    const double bytes = double(codes.size()) + 4.0 * double(scales.size()) + 2.0 * double(n);
    const double floor_ms = 1e3 * bytes / bandwidth;
    std::printf("%-4s dequantize: %8.1f ms, %5.1f GB/s, %3.0f%% of its memory roofline (%.1f ms)\n",
                model::BaseQuantName(q), ms, bytes / ms / 1e6, 100 * floor_ms / ms, floor_ms);
    for (int M : {128, 512, 2048}) {
      std::vector<bf16> x(size_t(M) * cols, ToBf16(0.5f)), y(size_t(M) * rows);
      const double mm = BestMs(reps, [&] {
        be.MatmulForward(y.data(), x.data(), out.data(), nullptr, M, int(cols), int(rows));
      });
      std::printf("     beside the bf16 product of %4d rows (%8.1f ms, %6.0f GFLOP/s): +%5.1f%%\n",
                  M, mm, 2.0 * M * double(n) / mm / 1e6, 100 * ms / mm);
    }
  }
  return 0;
}
