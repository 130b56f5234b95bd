// keel's side of bench/train_throughput and bench/zero_throughput: times full training steps
// (train::TrainStep: forward, backward, gradient strategy, AdamW) of a GPT-2 config and prints
// tokens/s, MFU, communication and a per-kernel breakdown as one JSON line (rank 0).
//
//   build/bench_train_step gpt2 4 256 bf16 [steps=10] [warmup=2] [recompute=none] [zero=0]
//                          [micro_batches=1] [pp=1] [virtual_stages=1] [pp_layers=equal|auto]
//                          [tp=1] [sp=0|1]
//   mpirun -np 2 build/bench_train_step gpt2 4 256 bf16 10 2 none 3    # dp 2, ZeRO-3
//   mpirun -np 2 build/bench_train_step gpt2 1 256 bf16 5 2 none 0 8 2  # pp 2, 8 micro-batches
//   mpirun -np 2 build/bench_train_step gpt2 1 256 bf16 5 2 none 0 8 1 1 equal 2 1  # tp 2 + sp
//                          [cp=1] [cp_comm=ring|allgather]   (context parallelism; a T past the
//                          model's block_size raises it: GPT-2's learned positions grow)
//   mpirun -np 2 build/bench_train_step gpt2-mini 1 8192 bf16 2 1 none 0 1 1 1 equal 1 0 2 ring
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/core/rng.h"
#include "keel/core/timer.h"
#include "keel/kernels/cpu_isa.h"
#include "keel/kernels/profile.h"
#include "keel/model/params.h"
#include "keel/monitor/flops.h"
#include "keel/monitor/machine_probe.h"
#include "keel/monitor/memory_usage.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/groups.h"
#include "keel/train/step.h"
#include "roofline.h"

using namespace keel;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: %s MODEL B T fp32|bf16 [steps] [warmup] [recompute] [zero] "
                 "[micro_batches] [pp] [virtual_stages] [equal|auto] [tp] [sp]\n",
                 argv[0]);
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
  cfg.block_size = std::max(cfg.block_size, T);

  auto comm = parallel::CreateComm();
  train::StepSpec spec;
  spec.model = cfg;
  spec.dtype = dtype;
  spec.layout.micro_batch = B;
  spec.seq_len = T;
  spec.recompute = recompute;
  const int m = argc > 9 ? std::atoi(argv[9]) : 1, pp = argc > 10 ? std::atoi(argv[10]) : 1;
  parallel::Layout& layout = spec.layout;
  layout.n_micro = m;
  layout.virtual_stages = argc > 11 ? std::atoi(argv[11]) : 1;
  const bool balanced = argc > 12 && std::string(argv[12]) == "auto";
  if (balanced) layout.stage_layers = model::BalancedStageLayers(cfg, T, pp);
  const int tp = argc > 13 ? std::atoi(argv[13]) : 1;
  layout.sp = argc > 14 && std::atoi(argv[14]) != 0;
  layout.cp = argc > 15 ? std::atoi(argv[15]) : 1;
  layout.cp_comm = argc > 16 && std::string(argv[16]) == "allgather" ? parallel::CpComm::kAllGather
                                                                     : parallel::CpComm::kRing;
  layout.dp = comm->size() / (pp * tp * layout.cp), layout.tp = tp, layout.pp = pp;
  layout.zero = argc > 8 ? std::atoi(argv[8]) : 0;
  const parallel::Groups g = parallel::MakeGroups(*comm, layout);
  train::TrainStep st(spec, g.ForStep());
  const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
  {
    std::vector<float> init(whole.total());
    model::InitParams(whole, cfg, 1, init.data());
    st.SetWeights(init.data());
  }
  Philox rng(1, uint64_t(g.at.dp));
  // Drawn once, outside the timed steps; each step copies them.
  std::vector<int32_t> toks(size_t(B) * T), tgts(toks.size());
  for (size_t i = 0; i < toks.size(); ++i) {
    toks[i] = int32_t(rng.Bits(i)[0] % 50257);
    tgts[i] = int32_t(rng.Bits(i)[1] % 50257);
  }
  auto next = [&](int32_t* tokens, int32_t* targets) {
    std::copy(toks.begin(), toks.end(), tokens);
    std::copy(tgts.begin(), tgts.end(), targets);
    return 0.0;
  };
  double total_s = 0, wait_ms = 0, sent = 0, pp_wait_ms = 0, bubble = 0, dp_wait_ms = 0,
         tp_wait_ms = 0, cp_wait_ms = 0, cp_bytes = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) kernels::ProfileReset(true);
    comm->Barrier();
    Timer t;
    st.ForwardBackward(m, next, 1.0f / float(B * T * m * layout.dp));
    {
      kernels::ProfileScope p("adamw");
      st.Update(1e-4f, 1.0f);
    }
    if (s >= warmup) {
      total_s += t.Seconds();
      wait_ms += st.comm_wait_ms();
      dp_wait_ms += st.dp_wait_ms();
      tp_wait_ms += st.tp_wait_ms();
      cp_wait_ms += st.cp_wait_ms();
      cp_bytes += st.cp_bytes();
      pp_wait_ms += st.pp_wait_ms();
      bubble += st.last_stage() ? st.bubble() : 0;
      sent += st.comm_bytes();
    }
  }
  total_s = comm->AllReduceMax(total_s);
  pp_wait_ms = comm->AllReduceMax(pp_wait_ms);
  dp_wait_ms = comm->AllReduceMax(dp_wait_ms);
  tp_wait_ms = comm->AllReduceMax(tp_wait_ms);
  cp_wait_ms = comm->AllReduceMax(cp_wait_ms);
  const double peak_rss = comm->AllReduceMax(monitor::ReadRss().peak);
  bubble = comm->AllReduceMax(bubble);  // the last stage's
  const double tok_s = double(B) * T * m * steps * layout.dp / total_s;
  const double params = double(model::MatmulParams(cfg));
  const double flops = monitor::TrainFlopsPerToken(params, cfg.n_layer, cfg.n_embd, T);
  const int threads = omp_get_max_threads();
  const auto scope =
      kernels::ProductsHeldToAvx2() ? monitor::PeakScope::kAvx2 : monitor::PeakScope::kCpu;
  const double peak = monitor::MachinePeak(DType(dtype), threads, 0, scope).flops;
  const auto breakdown = kernels::ProfileReport(steps);
  nlohmann::json out = {{"impl", "keel"},
                        {"model", name},
                        {"B", B},
                        {"T", T},
                        {"dtype", DTypeName(dtype)},
                        {"recompute", model::RecomputeName(recompute)},
                        {"threads", threads},
                        {"isa", kernels::IsaName(kernels::ChosenCpuIsa())},
                        {"tokens_per_s", tok_s},
                        {"ms_per_step", 1e3 * total_s / steps},
                        {"dp", layout.dp},
                        {"pp", pp},
                        {"tp", tp},
                        {"sp", layout.sp},
                        {"micro_batches", m},
                        {"virtual_stages", layout.virtual_stages},
                        {"pp_layers", balanced ? "auto" : "equal"},
                        {"zero", layout.zero},
                        {"mfu", flops * tok_s / peak / comm->size()},
                        {"peak_gflops", peak / 1e9},
                        {"comm_wait_ms", wait_ms / steps},
                        {"pp_wait_ms", pp_wait_ms / steps},
                        {"dp_wait_ms", dp_wait_ms / steps},
                        {"tp_wait_ms", tp_wait_ms / steps},
                        {"cp", layout.cp},
                        {"cp_comm", parallel::CpCommName(layout.cp_comm)},
                        {"cp_wait_ms", cp_wait_ms / steps},
                        {"cp_bytes", cp_bytes / steps},
                        {"peak_rss_mib", peak_rss / 1048576.0},
                        {"bubble", bubble / steps},
                        {"comm_bytes", sent / steps},
                        {"params", whole.total()},
                        {"memory_bytes", st.MemoryBytes()},
                        {"activation_mib", st.ActivationBytes() / 1048576.0},
                        {"breakdown_ms", breakdown}};
  // The dtype the matrix products ran in: "fp32" where bf16 ones widen (kernels/cpu_isa.h).
  out["products"] = st.backend().ProductsEmulated(DType(dtype)) ? "fp32" : DTypeName(DType(dtype));
  // Each kernel against its roofline: single process only (the shapes are the whole model's).
  if (comm->size() == 1) {
    // memcpy reads and writes each byte: its memory traffic is twice the bytes it copies.
    const double bw = 2 * monitor::MeasureCopyRate(threads, size_t(192) << 20, 5);
    out["bandwidth_gbs"] = bw / 1e9;
    out["roofline"] =
        bench::Roofline(breakdown, bench::StepCosts(cfg, B * m, T, dtype, double(whole.total())),
                        bw, monitor::MachinePeak(DType::kF32, threads, 0, scope).flops, peak);
  }
  if (comm->rank() == 0) std::printf("%s\n", out.dump().c_str());
  return 0;
}
