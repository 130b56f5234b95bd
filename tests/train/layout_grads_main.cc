// Tensor and pipeline parallelism's gradients: after one step's backward (the tied embedding's
// halves summed between the first and last stage, the LayerNorms' over the tp group under
// sequence parallelism), every parameter a rank holds — a stage's tensors, a tensor-parallel
// rank's shards of them — has the gradient one process computes for the whole model over the same
// micro-batches (the same slice of it), within 1e-5 relative to the tensor's largest value. Run by
// ctest as `mpirun -np 2` (pp 2, pp 2 interleaved with 2 chunks per rank at ZeRO 1, uneven
// stages, tp 2, tp 2 + sp) and `-np 4` (pp 4, dp 2 x pp 2 with ZeRO 1 plain and interleaved,
// tp 2 x pp 2 and dp 2 x tp 2 at ZeRO 1, both also with sp), and context parallelism (cp 2 at ZeRO
// 0 and 1, the all-gather too; cp 4, cp 2 x dp 2, cp 2 x tp 2 with and without sp (all-gather
// too), cp 2 x pp 2 plain and interleaved), for a GPT-2 and a
// Llama with grouped-query attention. Also: the
// whole model's weights gathered from the stages and shards are the ones set.
//
// Not named *_test.cc: that would glob it into the single-process train_test binary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "keel/model/transformer.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/groups.h"
#include "keel/plan/comm_time.h"
#include "keel/train/step.h"

namespace {

using namespace keel;

// 40 tokens: context parallelism at cp 4 cuts them into chunks of 5.
constexpr int kB = 2, kT = 40, kMicro = 4;

// Micro-batch k of data-parallel rank r: tokens and next-token targets, a pure function of both.
void Batch(int r, int k, int vocab, int32_t* tokens, int32_t* targets) {
  uint64_t x = 0x9E3779B97F4A7C15ull * uint64_t(1 + r * 131 + k);
  for (int i = 0; i < kB * kT + 1; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int32_t v = int32_t(x % uint64_t(vocab));
    if (i < kB * kT) tokens[i] = v;
    if (i > 0) targets[i - 1] = v;
  }
}

int Check(const std::string& name, parallel::Comm& world, const parallel::ParallelDims& dims,
          int v = 1, std::vector<int> stage_layers = {}, bool sp = false,
          parallel::CpComm way = parallel::CpComm::kRing) {
  parallel::Layout layout;
  static_cast<parallel::ParallelDims&>(layout) = dims;
  layout.cp_comm = way;
  layout.sp = sp;
  layout.virtual_stages = v;
  layout.stage_layers = stage_layers;
  layout.micro_batch = kB;
  layout.n_micro = kMicro;
  model::ModelConfig cfg = model::NamedConfig(name);
  cfg.n_layer = 4;
  const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
  std::vector<float> init(whole.total());
  model::InitParams(whole, cfg, /*seed=*/7, init.data());
  const float dloss = 1.0f / float(kB * kT * kMicro * dims.dp);

  // One process: the whole model over every data-parallel rank's micro-batches.
  model::Transformer ref(cfg, DType::kF32, kB, kT, model::Recompute::kNone);
  std::copy(init.begin(), init.end(), ref.master());
  ref.ZeroGrads();
  std::vector<int32_t> tok(kB * kT), tgt(kB * kT);
  for (int r = 0; r < dims.dp; ++r)
    for (int k = 0; k < kMicro; ++k) {
      Batch(r, k, cfg.vocab_size, tok.data(), tgt.data());
      ref.ForwardBackward(tok.data(), tgt.data(), dloss);
    }

  const parallel::Groups g = parallel::MakeGroups(world, layout);
  train::StepSpec spec;
  spec.model = cfg;
  spec.dtype = DType::kF32;
  spec.seq_len = kT;
  spec.layout = layout;
  spec.bucket_elems = 4096;
  spec.comm_timeout_s = 60;
  train::TrainStep st(spec, g.ForStep());
  st.SetWeights(init.data());
  int k = 0;
  st.ForwardBackward(
      kMicro,
      [&](int32_t* t, int32_t* y) {
        Batch(g.at.dp, k++, cfg.vocab_size, t, y);
        return 0.0;
      },
      dloss);

  int bad = 0;
  // Context parallelism: the keys and values this rank sent are what the planner prices.
  if (dims.cp > 1) {
    plan::Job job;
    job.model = plan::SpecOf(name, cfg, kT);
    job.precision = plan::Precision::kFp32;
    job.global_batch = kB * kMicro * dims.dp;
    job.cluster.world = world.size();
    plan::Layout pl;
    static_cast<parallel::Layout&>(pl) = layout;
    const double planned = plan::EstimateComm(job, pl).cp_bytes;
    if (st.cp_bytes() != planned) {
      std::printf("%s %s rank %d: sent %.0f bytes of keys and values, the planner says %.0f\n",
                  name.c_str(), parallel::DimsName(dims).c_str(), world.rank(), st.cp_bytes(),
                  planned);
      ++bad;
    }
  }
  // ZeRO 0 and 1 (fp32 gradients): every gradient of the rank's tensors.
  const float* grads = static_cast<const float*>(st.store().grads());
  std::vector<float> shards(st.layout().total());
  model::CopyShards(st.layout(), whole, ref.grads(), shards.data(), /*to_whole=*/false);
  for (const model::ParamInfo& p : st.layout().params()) {
    const float* want = shards.data() + p.offset;
    const float* got = grads + p.offset;
    double scale = 1e-12, worst = 0;
    for (size_t i = 0; i < p.numel; ++i) scale = std::max(scale, double(std::fabs(want[i])));
    for (size_t i = 0; i < p.numel; ++i)  // a NaN is the worst (std::max would pass it by)
      worst =
          std::isfinite(got[i]) ? std::max(worst, std::fabs(double(got[i]) - want[i])) : INFINITY;
    if (worst / scale > 1e-5) {
      std::printf("%s %s v=%d%s rank %d (stage %d): %s gradient differs by %.2e relative\n",
                  name.c_str(), parallel::DimsName(dims).c_str(), v, sp ? " sp" : "", world.rank(),
                  g.at.pp, p.name.c_str(), worst / scale);
      ++bad;
    }
  }
  const std::vector<float> gathered = st.GatherWeights();
  if (gathered != init) {
    std::printf("%s %s rank %d: gathered weights differ from the ones set\n", name.c_str(),
                parallel::DimsName(dims).c_str(), world.rank());
    ++bad;
  }
  if (world.rank() == 0)
    std::printf("%s %s v=%d%s: rank 0 holds %zu of %zu parameters; %zu tensors compared on it\n",
                name.c_str(), parallel::DimsName(dims).c_str(), v, sp ? " sp" : "",
                st.layout().total(), whole.total(), st.layout().params().size());
  return bad;
}

}  // namespace

int main() {
  auto world = keel::parallel::MakeMpiComm();
  const int n = world->size();
  int bad = 0;
  // GPT-2 (tied embedding, LayerNorm, biases) and Llama (untied lm_head, RMSNorm, grouped-query
  // attention with tp cutting the key/value heads, SwiGLU).
  for (const std::string m : {"gpt2-tiny", "llama-tiny"}) {
    bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/n, /*zero=*/0});
    if (n == 2) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/2, /*zero=*/1}, /*v=*/2);
    if (n == 2) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/2, /*zero=*/0}, 1, {3, 1});
    if (n == 4) bad += Check(m, *world, {/*dp=*/2, /*tp=*/1, /*pp=*/2, /*zero=*/1});
    if (n == 4) bad += Check(m, *world, {/*dp=*/2, /*tp=*/1, /*pp=*/2, /*zero=*/1}, /*v=*/2);
    if (n == 2) bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/1, /*zero=*/0});
    if (n == 4) bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/2, /*zero=*/0});
    if (n == 4) bad += Check(m, *world, {/*dp=*/2, /*tp=*/2, /*pp=*/1, /*zero=*/1});
    // Sequence parallelism: the LayerNorms' gradients are summed over the tp group.
    if (n == 2) bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/1, /*zero=*/0}, 1, {}, true);
    if (n == 4) bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/2, /*zero=*/0}, 1, {}, true);
    if (n == 4) bad += Check(m, *world, {/*dp=*/2, /*tp=*/2, /*pp=*/1, /*zero=*/1}, 1, {}, true);
    // Context parallelism: the cp ranks' gradients of their chunks summed like replicas'.
    if (n == 2) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/1, /*zero=*/0, /*cp=*/2});
    if (n == 2) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/1, /*zero=*/1, /*cp=*/2});
    if (n == 2)
      bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/1, /*zero=*/0, /*cp=*/2}, 1, {}, false,
                   parallel::CpComm::kAllGather);
    if (n == 4)
      bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/1, /*zero=*/0, /*cp=*/2}, 1, {}, false,
                   parallel::CpComm::kAllGather);
    if (n == 4) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/1, /*zero=*/1, /*cp=*/4});
    if (n == 4) bad += Check(m, *world, {/*dp=*/2, /*tp=*/1, /*pp=*/1, /*zero=*/1, /*cp=*/2});
    if (n == 4) bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/1, /*zero=*/0, /*cp=*/2});
    if (n == 4)
      bad += Check(m, *world, {/*dp=*/1, /*tp=*/2, /*pp=*/1, /*zero=*/0, /*cp=*/2}, 1, {}, true);
    if (n == 4) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/2, /*zero=*/1, /*cp=*/2});
    if (n == 4) bad += Check(m, *world, {/*dp=*/1, /*tp=*/1, /*pp=*/2, /*zero=*/1, /*cp=*/2}, 2);
  }
  const bool failed = world->AllReduceMax(double(bad)) > 0;
  if (world->rank() == 0) std::printf(failed ? "FAILED\n" : "all gradients match\n");
  return failed ? 1 : 0;
}
