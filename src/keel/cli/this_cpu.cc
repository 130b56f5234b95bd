// `--accelerator this-cpu`: this machine's peaks and the rate of keel's own kernels on a
// model's shapes, the figures `keel plan` and `keel preflight` plan this CPU with.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <type_traits>
#include <vector>

#include "keel/cli/verbs.h"
#include "keel/core/cpu_rates.h"
#include "keel/core/dtype.h"
#include "keel/core/error.h"
#include "keel/kernels/backend.h"
#include "keel/monitor/machine_probe.h"
#include "keel/plan/comm_time.h"
#include "keel/plan/hardware.h"
#include "keel/plan/job.h"
#include "keel/plan/memory.h"

namespace keel::cli {

plan::Accelerator MeasureThisCpu() {
  // Short runs (0.05 s per loop, best of 2; a 128 MiB copy, best of 3), on the threads a run
  // uses (OMP_NUM_THREADS, else every hardware thread); the per-thread CPU time keeps the peaks
  // honest on a busy machine.
  const int threads = std::max(1, omp_get_max_threads());
  const PeakRates r = MeasurePeakRates(threads, 0.05, 2);
  plan::CpuFigures f;
  // Without bf16 instructions, or with one slower than the FMA, keel's bf16 products run in fp32
  // (kernels/cpu/matmul.h): the fp32 peak.
  f.bf16_flops = r.bf16_products();
  f.fp32_flops = r.fp32_fma;
  f.memory_bytes = monitor::MemTotalBytes();
  f.copy_bytes_per_s = monitor::MeasureCopyRate(threads, size_t(128) << 20, 3);
  if (f.memory_bytes <= 0 || f.copy_bytes_per_s <= 0)
    ThrowRuntime("plan: this-cpu: could not measure this machine's memory (/proc/meminfo)");
  plan::Accelerator a = plan::ThisCpu(f);
  // Which loops gave the peaks, for the output.
  if (r.fma_bits == 512)
    a.measured_note =
        std::string("Peaks: AVX-512 FMA loop") +
        (r.amx_bf16 > 0      ? ", AMX tdpbf16ps"
         : !r.bf16_in_fp32() ? ", vdpbf16ps"
         : r.bf16_dpbf16 > 0 ? " (vdpbf16ps is slower here: bf16 products run in fp32)"
                             : " (no bf16 instructions: bf16 products run in fp32)");
  else if (r.fma_bits == 256)
    a.measured_note = "Peaks: AVX2 FMA loop (no AVX-512; bf16 products run in fp32)";
  else
    a.measured_note =
        "Peaks: none (no AVX2 or AVX-512 loop for this CPU; the measured rate stands in)";
  return a;
}

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The fastest of a few runs of `f`: at least 2 (the first builds oneDNN's primitive and touches
// scratch; and a burst of other load on a shared machine rarely hits both), until 50 ms are spent.
template <typename F>
double Fastest(F&& f) {
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    f();
    const double s = Since(t0);
    best = std::min(best, s);
    spent += s;
    if (rep >= 1 && spent > 0.05) break;
  }
  return best;
}

// A training step's time on this machine, from keel's own kernels (the ones train::TrainStep
// runs, on its threads and in its precision) timed on the model's shapes, each on a sample and
// scaled to the step: one layer's four products forward and backward (Backend::MatmulForward /
// MatmulBackward, bias gradients included), GELU and both LayerNorms on `rows` rows; attention on
// `att_seqs` whole sequences and `att_heads` of the heads; the fused classifier and cross-entropy
// (three products over the whole padded vocabulary, and the softmax) on `cls_rows` rows; AdamW on
// a slice of the parameters. Not timed (small): the embedding, and recomputation (the planner
// adds its FLOPs at the same rate).
struct KernelProbe {
  double step_s = 0;  // the estimated step: `seqs` sequences forward and backward, one update
  double flops = 0;   // the planner's hardware FLOPs of that step
  double layers_s = 0, classifier_s = 0, optimizer_s = 0;
  int rows = 0, att_seqs = 0, att_heads = 0, cls_rows = 0, threads = 0;
  double spent_s = 0;  // wall time of the measurement
};

// About this many FLOPs per sample (one layer's products; the classifier), each timed twice:
// 0.2 s at 120 GFLOP/s (2 AVX2 cores), a few ms with AMX; attention, at a lower rate, a quarter.
constexpr double kSampleFlops = 24e9;

template <typename T>
KernelProbe ProbeKernels(const plan::ModelSpec& m, int micro_batch, int seqs) {
  const kernels::Backend& k = kernels::Cpu();
  const auto start = Clock::now();
  const int C = m.hidden, NH = m.heads, Tn = m.seq, V = m.vocab, hs = C / NH;
  const int Vp = plan::ToModelConfig(m).padded_vocab();
  const double tokens = double(seqs) * Tn;
  KernelProbe p;
  p.threads = std::max(1, omp_get_max_threads());
  auto fill = [](std::vector<T>& v, int mod) {
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = FromFloat<T>(float(int(i % mod) - mod / 2) * 0.01f);
  };
  {
    // Rows of the products: the whole micro-batch, or a multiple of 64 rows where that would
    // take long (a product's rate hardly depends on its rows beyond a few hundred).
    const int all_rows = micro_batch * Tn;
    const int cap = std::max(64, int(kSampleFlops / (72.0 * C * C)) / 64 * 64);
    p.rows = std::min(all_rows, cap);
    const int R = p.rows;
    std::vector<T> x(size_t(R) * 4 * C), w(size_t(4) * C * C), y(size_t(R) * 4 * C),
        dy(size_t(R) * 4 * C), dx(size_t(R) * 4 * C), ln_w(C, FromFloat<T>(1.0f)), ln_b(C);
    std::vector<float> bias(4 * C, 0.01f), dw(size_t(4) * C * C), db(4 * C), dlnw(C), dlnb(C),
        mean(R), rstd(R);
    fill(x, 7);
    fill(w, 5);
    fill(dy, 3);
    // The four products of a block: qkv (C -> 3C), attention projection (C -> C, the residual
    // folded in), MLP up (C -> 4C) and down (4C -> C, residual folded in).
    const struct {
      int K, N;
      bool acc;
    } products[] = {{C, 3 * C, false}, {C, C, true}, {C, 4 * C, false}, {4 * C, C, true}};
    double per_rows = 0;  // one layer's time on R rows, attention aside
    for (const auto& q : products) {
      per_rows += Fastest([&] {
        k.MatmulForward<T>(y.data(), x.data(), w.data(), bias.data(), R, q.K, q.N, q.acc);
      });
      per_rows += Fastest([&] {
        k.MatmulBackward<T>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), R, q.K,
                            q.N);
      });
    }
    const size_t h = size_t(R) * 4 * C;
    per_rows += Fastest([&] { k.GeluForward<T>(y.data(), x.data(), h); });
    per_rows += Fastest([&] { k.GeluBackward<T>(dx.data(), x.data(), dy.data(), h); });
    const double ln =
        Fastest([&] {
          k.LayerNormForward<T>(y.data(), mean.data(), rstd.data(), x.data(), ln_w.data(),
                                ln_b.data(), R, C);
        }) +
        Fastest([&] {
          k.LayerNormBackward<T>(dx.data(), dlnw.data(), dlnb.data(), dy.data(), x.data(),
                                 ln_w.data(), mean.data(), rstd.data(), R, C);
        });
    per_rows += 2 * ln;
    // Attention on whole sequences (it is causal over T); where even one is long, on some of the
    // heads (each head is independent work of the same shape). About 12·T²·hs FLOPs per head and
    // sequence, forward and backward.
    const double head_flops = 12.0 * Tn * double(Tn) * hs;
    p.att_seqs = std::clamp(int(kSampleFlops / 4 / (head_flops * NH)), 1, micro_batch);
    p.att_heads = std::clamp(int(kSampleFlops / 4 / head_flops), 1, NH);
    const int Ca = p.att_heads * hs;
    std::vector<T> qkv(size_t(p.att_seqs) * Tn * 3 * Ca), dqkv(qkv.size()),
        out(size_t(p.att_seqs) * Tn * Ca), dout(out.size());
    std::vector<float> lse(size_t(p.att_seqs) * p.att_heads * Tn);
    fill(qkv, 7);
    fill(dout, 3);
    const double att = Fastest([&] {
                         k.AttentionForward<T>(out.data(), lse.data(), qkv.data(), p.att_seqs, Tn,
                                               Ca, p.att_heads);
                       }) +
                       Fastest([&] {
                         k.AttentionBackward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                                lse.data(), p.att_seqs, Tn, Ca, p.att_heads);
                       });
    // Each layer, and ln_f once, over the step's tokens.
    p.layers_s =
        m.layers * (per_rows / R * tokens + att * double(NH) / p.att_heads * seqs / p.att_seqs) +
        ln / R * tokens;
  }
  {
    // The classifier runs each micro-batch in tiles of up to 512 rows (kernels/cpu/classifier.cc);
    // a sample of whole rows over the whole vocabulary, a multiple of 32 rows.
    const int max_rows = std::min(512, micro_batch * Tn);
    p.cls_rows =
        std::clamp(int(kSampleFlops / (6.0 * C * Vp)) / 32 * 32, std::min(32, max_rows), max_rows);
    // A constant embedding: cheaper to fill than a pattern, and the time does not depend on it.
    std::vector<T> x(size_t(p.cls_rows) * C), dx(size_t(p.cls_rows) * C),
        wte(size_t(Vp) * C, FromFloat<T>(0.01f));
    std::vector<float> dwte(size_t(Vp) * C), losses(p.cls_rows);
    std::vector<int32_t> targets(p.cls_rows);
    fill(x, 7);
    for (int i = 0; i < p.cls_rows; ++i) targets[i] = int32_t(size_t(i) * 7919 % size_t(V));
    auto run = [&](int rows) {
      k.ClassifierForwardBackward<T>(losses.data(), dx.data(), dwte.data(), x.data(), wte.data(),
                                     targets.data(), 1.0f / rows, rows, C, V, Vp);
    };
    // Each tile also pays a cost that does not grow with its rows: reading the embedding in
    // each of the three products, and where bf16 products run in fp32, widening it to fp32
    // twice. One row measures that part (and, first, allocates and touches the kernel's scratch:
    // a whole tile of logits, hundreds of MB); the sample's rows give the cost per row.
    const double one = Fastest([&] { run(1); });
    const double sample = Fastest([&] { run(p.cls_rows); });
    const double per_row = std::max(0.0, sample - one) / std::max(1, p.cls_rows - 1);
    const int mb_rows = micro_batch * Tn, tiles = (mb_rows + 511) / 512;
    p.classifier_s = (tiles * one + (mb_rows - tiles) * per_row) * double(seqs) / micro_batch;
  }
  {
    // AdamW over a slice of up to 4M parameters (memory-bound: linear in the count), as the
    // trainer runs it in this precision (bf16 also rounds into the working copy). The step also
    // zeroes the gradients and reads them once for the global norm: 8 more bytes per parameter
    // on AdamW's 30 (bf16; 28 in fp32), counted in proportion.
    const double n_params = plan::TotalParams(m);
    const size_t n = size_t(std::min(n_params, 4.0 * (1 << 20)));
    std::vector<float> master(n, 0.01f), m1(n), v1(n), grad(n, 1e-3f);
    std::vector<bf16> working(std::is_same_v<T, bf16> ? n : 0);
    kernels::AdamWParams hp;
    const double t = Fastest([&] {
      k.AdamWUpdate(master.data(), std::is_same_v<T, bf16> ? working.data() : nullptr, m1.data(),
                    v1.data(), grad.data(), n, hp);
    });
    const double bytes = std::is_same_v<T, bf16> ? 30 : 28;
    p.optimizer_s = t * n_params / double(n) * (bytes + 8) / bytes;
  }
  p.step_s = p.layers_s + p.classifier_s + p.optimizer_s;
  p.flops = tokens * plan::HardwareFlopsPerToken(m, plan::TotalParams(m), plan::Recompute::kNone);
  p.spent_s = Since(start);
  return p;
}

// The shapes the kernels are timed on: the model's own, or, for a model wider, longer or with a
// larger vocabulary than keel's largest GPT-2 configs, a proxy capped at hidden 2048 (same head
// size), sequence 2048 and vocabulary 65536, so that the weights timed stay small (a 175B layer
// alone is 7 GB in fp32). The rate, not the time, carries over to the model.
plan::ModelSpec ProbeShapes(const plan::ModelSpec& m) {
  plan::ModelSpec s = m;
  const int hs = m.hidden / m.heads;
  if (m.hidden > 2048) {
    s.heads = std::max(1, 2048 / hs);
    s.hidden = s.heads * hs;
    s.name = m.name + " (proxy)";
  }
  if (m.seq > 2048 || m.vocab > 65536) s.name = m.name + " (proxy)";
  s.seq = std::min(m.seq, 2048);
  s.vocab = std::min(m.vocab, 65536);
  return s;
}

// this-cpu without --efficiency: times keel's kernels on the job's shapes and puts the rate in
// the accelerator (Accelerator::measured_flops), from which DefaultEfficiency follows. The sample
// is the fixed micro-batch, or each rank's share of the global batch.
}  // namespace

void MeasureKernels(plan::Job& job, int micro_batch) {
  const int seqs = std::max(1, job.global_batch / std::max(1, job.cluster.world));
  const int b = micro_batch > 0 ? std::min(micro_batch, seqs) : seqs;
  const bool fp32 = job.precision == plan::Precision::kFp32;
  const plan::ModelSpec shapes = ProbeShapes(job.model);
  const KernelProbe p =
      fp32 ? ProbeKernels<float>(shapes, b, seqs) : ProbeKernels<bf16>(shapes, b, seqs);
  plan::Accelerator& acc = job.cluster.accel;
  acc.measured_flops = p.flops / p.step_s;
  acc.measured_fp32 = fp32;
  if (plan::PeakFlops(acc, fp32) <= 0)
    (fp32 ? acc.fp32_flops : acc.bf16_flops) = acc.measured_flops;
  char buf[640];
  std::snprintf(buf, sizeof(buf),
                "%.4g GFLOP / %.3g s per step: keel's %s kernels on %s's shapes (hidden %d, seq "
                "%d), %d thread%s, %d sequences: layers %.3g s (products on %d rows, attention on "
                "%d sequence%s x %d of %d heads), classifier %.3g s (on %d rows), AdamW %.3g s; "
                "measuring took %.2g s. %s",
                p.flops / 1e9, p.step_s, fp32 ? "fp32" : "bf16", shapes.name.c_str(), shapes.hidden,
                shapes.seq, p.threads, p.threads == 1 ? "" : "s", seqs, p.layers_s, p.rows,
                p.att_seqs, p.att_seqs == 1 ? "" : "s", p.att_heads, shapes.heads, p.classifier_s,
                p.cls_rows, p.optimizer_s, p.spent_s, acc.measured_note.c_str());
  acc.measured_note = buf;
}

}  // namespace keel::cli
