// keel's side of bench/train_throughput: times full training steps (forward, backward, AdamW) of
// a GPT-2 config and prints tokens/s, MFU and a per-kernel breakdown as one JSON line.
//
//   build/bench_train_step gpt2 4 256 bf16 [steps=10] [warmup=2] [recompute=none]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/core/rng.h"
#include "keel/core/timer.h"
#include "keel/kernels/profile.h"
#include "keel/model/gpt.h"
#include "keel/monitor/flops.h"
#include "keel/optim/adamw.h"

using namespace keel;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL B T fp32|bf16 [steps] [warmup] [recompute]\n", argv[0]);
    return 2;
  }
  const std::string name = argv[1];
  const int B = std::atoi(argv[2]), T = std::atoi(argv[3]);
  const DType dtype = std::string(argv[4]) == "fp32" ? DType::kF32 : DType::kBF16;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 10;
  const int warmup = argc > 6 ? std::atoi(argv[6]) : 2;
  const auto recompute = model::ParseRecompute(argc > 7 ? argv[7] : "none");
  model::ModelConfig cfg;
  if (name == "small6")
    cfg = {6, 6, 384, 50257, 1024};
  else
    cfg = model::NamedConfig(name);

  model::GptModel m(cfg, dtype, B, T, recompute);
  model::InitParams(m.layout(), cfg, 1, m.master());
  m.SyncWorking();
  std::vector<optim::ParamRange> ranges;
  for (const auto& p : m.layout().params()) ranges.push_back({p.offset, p.numel, p.decay});
  optim::AdamW opt(ranges, m.layout().total(), {});
  std::vector<int32_t> tokens(size_t(B) * T), targets(tokens.size());
  Philox rng(1, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(rng.Bits(i)[0] % 50257);
    targets[i] = int32_t(rng.Bits(i)[1] % 50257);
  }
  double total_s = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) kernels::ProfileReset(true);
    Timer t;
    m.ZeroGrads();
    m.ForwardBackward(tokens.data(), targets.data(), 1.0f / (B * T));
    {
      kernels::ProfileScope p("adamw");
      double norm = optim::GlobalGradNorm(m.grads(), m.layout().total());
      opt.Step(m.master(), m.working_bf16(), m.grads(), 1e-4f, optim::ClipScale(norm, 1.0f));
    }
    if (s >= warmup) total_s += t.Seconds();
  }
  const double tok_s = double(B) * T * steps / total_s;
  const double params = double(m.layout().total() - m.layout().Find("wpe.weight").numel);
  const double flops = monitor::TrainFlopsPerToken(params, cfg.n_layer, cfg.n_embd, T);
  const int threads = omp_get_max_threads();
  nlohmann::json out = {{"impl", "keel"},
                        {"model", name},
                        {"B", B},
                        {"T", T},
                        {"dtype", DTypeName(dtype)},
                        {"recompute", model::RecomputeName(recompute)},
                        {"threads", threads},
                        {"tokens_per_s", tok_s},
                        {"ms_per_step", 1e3 * total_s / steps},
                        {"mfu", flops * tok_s / monitor::PeakFlops(dtype, threads)},
                        {"activation_mib", m.activation_plan().total_bytes / 1048576.0},
                        {"breakdown_ms", kernels::ProfileReport(steps)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
