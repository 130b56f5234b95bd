// The layout search: a plain enumeration (a few thousand layouts at most), each evaluated by the
// closed-form models in memory.cc and comm_time.cc.
#include "keel/plan/search.h"

#include <algorithm>
#include <cstdio>

#include "keel/core/error.h"
#include "keel/model/quantize.h"

namespace keel::plan {

Estimate Evaluate(const Job& job, const Layout& l) {
  Estimate e;
  e.layout = l;
  e.memory = EstimateMemory(job, l);
  e.comm = EstimateComm(job, l);
  e.time = EstimateTime(job, l, e.comm, e.memory.tier_traffic);
  e.ckpt = PlanCheckpoints(job);
  e.cost = EstimateCost(job, e.time, e.ckpt);
  e.activation_row = e.memory.exact_activations ? "keel arena (model::PlanActivations)"
                                                : ActivationRow(l.tp, l.sp, l.recompute);
  e.fits = e.memory.fits();
  if (!e.fits) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "needs %.2f GB + %.2f GB headroom > %.2f GB per accelerator",
                  e.memory.used() / 1e9, e.memory.headroom / 1e9, e.memory.capacity / 1e9);
    e.reason = buf;
  }
  return e;
}

std::string LayoutName(const Layout& l) {
  return "tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp) +
         " dp=" + std::to_string(l.dp) + " zero=" + std::to_string(l.zero) +
         " mb=" + std::to_string(l.micro_batch) + " recompute=" + RecomputeName(l.recompute) +
         " sp=" + (l.sp ? "on" : "off") +
         (l.virtual_stages > 1 ? " v=" + std::to_string(l.virtual_stages) : "") +
         (l.cp > 1 ? " cp=" + std::to_string(l.cp) + " " + parallel::CpCommName(l.cp_comm) : "");
}

namespace {

std::vector<int> Candidates(int fixed, int max) {
  if (fixed > 0) return {fixed};
  std::vector<int> v;
  for (int i = 1; i <= max; ++i) v.push_back(i);
  return v;
}

}  // namespace

std::vector<Estimate> Search(const Job& job, const Constraints& c) {
  ValidateModel(job.model);
  const int world = job.cluster.world;
  if (world < 1 || job.cluster.per_node < 1)
    ThrowBadInput("plan: accelerators and per-node must be >= 1");
  if (job.global_batch < 1) ThrowBadInput("plan: global batch must be >= 1");
  // Fixed values are checked first, so the user sees the exact rule a request breaks.
  auto n = [](long v) { return std::to_string(v); };
  if (c.tp > 0 && job.model.heads % c.tp)
    ThrowBadInput("plan: heads " + n(job.model.heads) + " % tp " + n(c.tp) + " = " +
                  n(job.model.heads % c.tp) + ": tp must divide the number of heads");
  if (c.pp > 0 && job.model.layers % c.pp)
    ThrowBadInput("plan: layers " + n(job.model.layers) + " % pp " + n(c.pp) + " = " +
                  n(job.model.layers % c.pp) + ": pp must divide the number of layers");
  const int cp_fixed = c.cp > 0 ? c.cp : 1;
  if (c.cp > 0 && job.model.seq % (2 * c.cp))
    ThrowBadInput("plan: cp " + n(c.cp) + " cuts each sequence into 2 x cp = " + n(2 * c.cp) +
                  " chunks: the sequence length " + n(job.model.seq) + " is not divisible by " +
                  n(2 * c.cp));
  if (c.tp > 0 && c.pp > 0 && c.dp > 0 && long(c.tp) * c.pp * c.dp * cp_fixed != world)
    ThrowBadInput("plan: world " + n(world) + " != tp " + n(c.tp) + " x pp " + n(c.pp) +
                  (c.cp > 0 ? " x cp " + n(c.cp) : "") + " x dp " + n(c.dp) + " = " +
                  n(long(c.tp) * c.pp * c.dp * cp_fixed));
  const long fixed_split =
      long(c.tp > 0 ? c.tp : 1) * (c.pp > 0 ? c.pp : 1) * (c.dp > 0 ? c.dp : 1) * cp_fixed;
  if (world % fixed_split)
    ThrowBadInput("plan: world " + n(world) + " is not divisible by tp x pp x dp" +
                  (c.cp > 0 ? " x cp" : "") + " = " + n(fixed_split));
  const long batch_unit = long(c.dp > 0 ? c.dp : 1) * (c.micro_batch > 0 ? c.micro_batch : 1);
  if (job.global_batch % batch_unit)
    ThrowBadInput("plan: global batch " + n(job.global_batch) + " is not divisible by dp " +
                  n(c.dp > 0 ? c.dp : 1) + " x micro-batch " +
                  n(c.micro_batch > 0 ? c.micro_batch : 1) + " = " + n(batch_unit));
  if (c.zero > 3) ThrowBadInput("plan: zero stage " + n(c.zero) + " not in 0..3");
  // LoRA: the trainer's ZeRO 0, 1 and 3, and no tp an nf4 base's groups cannot be cut by
  // (job.h's CheckLayout).
  const bool lora = job.model.lora_rank > 0;
  const model::ModelConfig mcfg = ToModelConfig(job.model);
  auto tp_cuts_base = [&](int tp) { return !model::TpQuantProblem(mcfg, tp).empty(); };
  if (lora && c.zero == 2)
    ThrowBadInput(
        "plan: LoRA runs with ZeRO 0, 1 or 3 (ZeRO 2 would shard the adapters' gradients "
        "alone, a few MB)");
  if (c.tp > 1 && tp_cuts_base(c.tp))
    ThrowBadInput("plan: --lora-base nf4: " + model::TpQuantProblem(mcfg, c.tp));
  // DiLoCo: the trainer's ZeRO 0 with data parallelism alone (job.h's CheckLayout).
  const bool diloco = job.diloco_inner_steps > 0;
  if (diloco && (c.zero > 0 || c.tp > 1 || c.pp > 1 || c.cp > 1))
    ThrowBadInput("plan: DiLoCo runs with ZeRO 0 and tp = pp = cp = 1");
  const int v = c.virtual_stages;
  if (c.pp > 1 && c.zero >= 2)
    ThrowBadInput("plan: --zero " + n(c.zero) + " with --pp " + n(c.pp) +
                  ": pipeline stages take ZeRO 0 or 1 (their gradients are not sharded)");
  if (v < 1) ThrowBadInput("plan: --virtual-stages " + n(v) + ": expected >= 1");
  if (v > 1 && c.pp > 0 && job.model.layers % (long(c.pp) * v))
    ThrowBadInput("plan: layers " + n(job.model.layers) + " % (pp " + n(c.pp) +
                  " x virtual stages " + n(v) + ") = " + n(job.model.layers % (long(c.pp) * v)) +
                  ": each chunk holds whole layers");
  std::vector<Recompute> rcs = c.recompute;
  if (rcs.empty()) rcs = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

  // Context parallelism splits each sequence over cp ranks, in 2·cp chunks: searched for long
  // sequences (or as asked); the other dimensions share what it leaves of the world.
  std::vector<int> cps;
  for (int cp : Candidates(c.cp, world))
    if (world % cp == 0 && (cp == 1 || job.model.seq % (2 * cp) == 0) && !(diloco && cp > 1) &&
        (cp == 1 || c.cp > 0 || job.model.seq >= kCpSearchFrom))
      cps.push_back(cp);
  std::vector<Estimate> out;
  std::string refused;  // the trainer's first refusal of a candidate, said when none is left
  for (int cp : cps) {
    const int world_cp = world / cp;
    // A layout the trainer would refuse (ZeRO 2/3 with pp > 1, kv heads or the padded vocabulary
    // not divisible by tp, fewer micro-batches than stages) is no candidate.
    auto add = [&](int dp, int tp, int pp, int zero, int mb, Recompute rc, bool sp) {
      Layout l = Layout::Of({dp, tp, pp, zero, cp}, mb, rc, sp, v);
      l.cp_comm = c.cp_comm;
      try {
        CheckLayout(job, l);
      } catch (const Error& e) {
        if (refused.empty()) refused = e.what();
        return;
      }
      out.push_back(Evaluate(job, l));
    };
    for (int tp : Candidates(c.tp, world_cp)) {
      if (world_cp % tp || job.model.heads % tp || tp_cuts_base(tp) || (diloco && tp > 1)) continue;
      for (int pp : Candidates(c.pp, world_cp / tp)) {
        if ((world_cp / tp) % pp || job.model.layers % pp || (diloco && pp > 1)) continue;
        // Interleaving needs a pipeline, whole layers per chunk, and groups of pp micro-batches.
        if (v > 1 && (pp == 1 || job.model.layers % (pp * v))) continue;
        const int dp = world_cp / (tp * pp);
        if (c.dp > 0 && dp != c.dp) continue;
        if (job.global_batch % dp) continue;
        const int per_dp = job.global_batch / dp;
        for (int mb = 1; mb <= per_dp; mb *= 2) {
          if (c.micro_batch > 0 && mb != c.micro_batch) continue;
          if (per_dp % mb) continue;
          if (v > 1 && (per_dp / mb) % pp) continue;
          for (int zero = 0; zero <= (diloco ? 0 : 3); ++zero) {
            if (lora && zero == 2) continue;
            if (c.zero >= 0 && zero != c.zero) continue;
            if (c.zero < 0 && zero > 0 && dp * cp == 1) continue;  // nothing to shard over
            for (Recompute rc : rcs) {
              for (int sp = 0; sp <= 1; ++sp) {
                if (c.sp >= 0 && sp != c.sp) continue;
                if (c.sp < 0 && sp && tp == 1) continue;  // sp means nothing without tp
                add(dp, tp, pp, zero, mb, rc, sp == 1);
              }
            }
          }
        }
        // An explicitly requested micro-batch that is not a power of two.
        if (c.micro_batch > 0 && (c.micro_batch & (c.micro_batch - 1)) &&
            per_dp % c.micro_batch == 0)
          for (int zero = 0; zero <= (diloco ? 0 : 3); ++zero)
            for (Recompute rc : rcs)
              for (int sp = 0; sp <= 1; ++sp) {
                if ((c.zero >= 0 && zero != c.zero) || (c.sp >= 0 && sp != c.sp)) continue;
                if (lora && zero == 2) continue;
                if ((c.zero < 0 && zero > 0 && dp * cp == 1) || (c.sp < 0 && sp && tp == 1))
                  continue;
                if (v > 1 && (per_dp / c.micro_batch) % pp) continue;
                add(dp, tp, pp, zero, c.micro_batch, rc, sp == 1);
              }
      }
    }
  }
  // The trainer's words name its config keys ([parallel] zero, ...): said as the reason.
  if (out.empty() && !refused.empty())
    ThrowBadInput(
        "plan: every layout that meets the request is one keel train refuses; the "
        "first: " +
        refused);
  if (out.empty())
    ThrowBadInput("plan: no layout of " + std::to_string(world) +
                  " accelerators satisfies the request (global batch " +
                  std::to_string(job.global_batch) + ", heads " + std::to_string(job.model.heads) +
                  ", layers " + std::to_string(job.model.layers) + ")");
  std::stable_sort(out.begin(), out.end(), [](const Estimate& a, const Estimate& b) {
    if (a.fits != b.fits) return a.fits;
    // Among equally fast layouts, the one with more memory to spare.
    if (a.fits && a.time.tokens_per_s != b.time.tokens_per_s)
      return a.time.tokens_per_s > b.time.tokens_per_s;
    return a.memory.used() < b.memory.used();
  });
  return out;
}

}  // namespace keel::plan
