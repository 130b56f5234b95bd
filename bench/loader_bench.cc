// Loader throughput: samples/s of shuffled windows from memory-mapped shards, one source and a
// two-source blend, beside what GPT-2 124M training consumes (so data never bounds the step).
//
//   build/loader_bench DATASET [T=1024] [seconds=2] [consumer_tokens_per_s=758]
// The consumer figure defaults to keel's bf16 124M B=4 T=256 throughput (docs/PERFORMANCE.md).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "keel/core/timer.h"
#include "keel/data/dataset.h"
#include "keel/data/loader.h"

using namespace keel;

namespace {

double SamplesPerSecond(data::BatchLoader& loader, int T, double seconds) {
  const int micro = 8;
  std::vector<int32_t> tokens(size_t(micro) * T), targets(tokens.size());
  Timer t;
  long samples = 0;
  while (t.Seconds() < seconds) {
    loader.Next(micro, tokens.data(), targets.data());
    samples += micro;
  }
  return samples / t.Seconds();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DATASET [T] [seconds] [consumer_tokens_per_s]\n", argv[0]);
    return 2;
  }
  const int T = argc > 2 ? std::atoi(argv[2]) : 1024;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 2.0;
  const double consumer = argc > 4 ? std::atof(argv[4]) : 758.0;
  auto ds = data::TokenDataset::Open(argv[1]);
  data::BatchLoader one(ds, T, 8, 0, 1, 1, /*shuffle=*/true);
  data::BatchLoader blend({&ds, &ds}, {0.7, 0.3}, T, 8, 0, 1, 1);
  const double s1 = SamplesPerSecond(one, T, seconds), s2 = SamplesPerSecond(blend, T, seconds);
  const double need = consumer / T;
  std::printf(
      "{\"T\": %d, \"shuffled_samples_per_s\": %.0f, \"blend_samples_per_s\": %.0f, "
      "\"consumer_samples_per_s\": %.2f, \"ratio_shuffled\": %.0f, \"ratio_blend\": %.0f}\n",
      T, s1, s2, need, s1 / need, s2 / need);
  return 0;
}
