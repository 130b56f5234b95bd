#include "keel/train/step.h"

#include <algorithm>
#include <cmath>

#include "keel/ckpt/checkpoint_model.h"
#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/kernels/op_args.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/pipeline_schedule.h"
#include "keel/parallel/zigzag.h"
#include "keel/train/freeze.h"

namespace keel::train {
namespace {

// A sum over a group of gradients [at, at + n) of the store's buffer, started: in place when they
// are fp32; bf16 ones (optim.grad_dtype) widened into `wide` (n fp32, the caller's scratch),
// summed there and rounded back once (FinishGradSum), so that no rank adds in bf16.
struct GradSum {
  std::unique_ptr<parallel::Work> op;
  float* wide = nullptr;
  bf16* dst = nullptr;
  size_t n = 0;
};

GradSum StartGradSum(parallel::Comm& c, optim::ParamStore& st, size_t at, size_t n, float* wide) {
  GradSum g;
  if (st.grad_dtype() == DType::kF32) {
    g.op = c.AllReduceSumAsync(static_cast<float*>(st.grads()) + at, n);
    return g;
  }
  g.dst = static_cast<bf16*>(st.grads()) + at;
  g.n = n;
  g.wide = wide;
  st.backend().ToF32(wide, g.dst, n);
  g.op = c.AllReduceSumAsync(wide, n);
  return g;
}

// Milliseconds waited.
double FinishGradSum(GradSum& g, const kernels::Backend& be, double timeout_s, const char* what) {
  const double ms = parallel::WaitOrLost(*g.op, timeout_s, what);
  if (g.dst) be.ToBf16(g.dst, g.wide, g.n);
  return ms;
}

// A step's LoRA dropout key, from the seed and the step.
uint64_t DropoutKey(uint64_t seed, int64_t step) {
  return kernels::SplitMix64(seed * 0xD1B54A32D192ED03ull + uint64_t(step) * 0x9E3779B97F4A7C15ull);
}

std::vector<optim::ParamRange> RangesOf(const model::ParamLayout& layout,
                                        const std::vector<bool>& frozen) {
  std::vector<optim::ParamRange> r;
  for (const model::ParamInfo& p : layout.params())
    r.push_back({p.offset, p.numel, p.decay, !frozen.empty() && frozen[p.stream], p.replica,
                 SIZE_MAX, p.work_offset,
                 // A tensor every tp rank holds whole draws alike there, so the copies stay equal.
                 optim::RoundStream(p.name, p.tp_axis >= 0 ? layout.tp().rank : 0), 0});
  return r;
}

parallel::StateShape ShapeOf(const model::ParamLayout& layout, const StepSpec& spec) {
  return parallel::WithTiers(model::StateShapeOf(layout, spec.dtype), spec.tiers);
}

// This rank's chunks: virtual stage c·p + s of p·v equal ones, for c < v.
std::vector<model::StageRange> ChunksFor(const StepSpec& spec, const parallel::Comm* pp) {
  if (!pp || pp->size() == 1) return {model::WholeModel(spec.model)};
  const int p = pp->size(), v = spec.layout.virtual_stages;
  const std::vector<int>& stage_layers = spec.layout.stage_layers;
  if (!stage_layers.empty()) {
    KEEL_CHECK(v == 1 && int(stage_layers.size()) == p, "TrainStep: stage_layers != pp");
    return {model::StageOf(spec.model, stage_layers, pp->rank())};
  }
  KEEL_CHECK(v >= 1 && spec.model.n_layer % (p * v) == 0,
             "TrainStep: pp x virtual_stages must divide n_layer (config validation says so)");
  std::vector<model::StageRange> chunks;
  for (int c = 0; c < v; ++c)
    chunks.push_back(model::StageOf(spec.model, p * v, c * p + pp->rank()));
  return chunks;
}

}  // namespace

TrainStep::TrainStep(const StepSpec& spec, parallel::Comm& dp_comm)
    : TrainStep(spec, StepGroups{&dp_comm}) {}

TrainStep::TrainStep(const StepSpec& spec, const StepGroups& groups)
    : spec_(spec),
      be_(kernels::Get(spec.device)),
      g_(groups),
      comm_(*groups.dp),
      layout_(model::ParamLayout::Stage(
          spec.model, ChunksFor(spec, groups.pp),
          {groups.tp ? groups.tp->size() : 1, groups.tp ? groups.tp->rank() : 0})) {
  KEEL_CHECK(!g_.pp || g_.pp->size() == spec.layout.pp, "TrainStep: pp group size != layout.pp");
  KEEL_CHECK(layout_.tp().size == spec.layout.tp, "TrainStep: tp group size != layout.tp");
  KEEL_CHECK(spec.layout.cp == (g_.cp ? g_.cp->size() : 1),
             "TrainStep: cp group size != layout.cp");
  KEEL_CHECK(spec.layout.cp == 1 || spec.model.lora_dropout == 0,
             "TrainStep: LoRA dropout's masks are a whole sequence's");
  // LoRA trains its adapters only, whoever builds the step (the trainer passes the same).
  if (spec_.model.lora_rank > 0 && spec_.frozen.empty())
    spec_.frozen = FrozenParams("", model::ParamLayout::Whole(spec_.model));
  optim::AdamWHyper hyper = spec.hyper;
  hyper.seed = spec.seed;
  store_ = std::make_unique<optim::ParamStore>(ShapeOf(layout_, spec_), spec.layout, comm_.rank(),
                                               RangesOf(layout_, spec_.frozen), hyper, be_,
                                               spec.offload_dir);
  const bool diloco = spec.diloco.inner_steps > 0;
  // Under DiLoCo the gradients stay the replica's; grad_comm is the pseudo-gradients' format.
  zero_ = std::make_unique<ZeroStrategy>(
      *store_, layout_, comm_, spec.bucket_elems, spec.comm_timeout_s,
      diloco ? parallel::GradWire::kF32 : spec.tiers.grad_comm, diloco);
  if (diloco)
    outer_ = std::make_unique<OuterLoop>(*store_, *zero_, comm_, spec.diloco, spec.tiers.grad_comm,
                                         spec.comm_timeout_s);
  sum_scratch_ =
      Buffer(be_, 4 * parallel::GradSumScratchElems(ShapeOf(layout_, spec_), spec.layout));
  const int pp = g_.pp ? g_.pp->size() : 1, stage = g_.pp ? g_.pp->rank() : 0;
  const auto& chunks = layout_.chunks();
  const std::vector<int> slots =
      parallel::PipelineSlots(pp, stage, int(chunks.size()), spec.layout.n_micro);
  std::vector<model::Transformer*> ptrs;
  for (size_t c = 0; c < chunks.size(); ++c) {
    models_.push_back(std::make_unique<model::Transformer>(
        spec.model, spec.dtype, spec.layout.micro_batch, spec.seq_len / spec.layout.cp,
        spec.recompute, zero_.get(), layout_, chunks[c], slots[c],
        model::LayerGroups{g_.tp, spec.comm_timeout_s, spec.layout.sp, g_.cp, spec.layout.cp_comm},
        be_));
    models_.back()->SetDocumentMask(spec.document_eos);
    models_.back()->SetFrozen(spec_.frozen);
    ptrs.push_back(models_.back().get());
  }
  size_t fp8_floats = 0;
  for (auto& m : models_) fp8_floats += m->Fp8StateFloats();
  fp8_saved_.assign(fp8_floats, 0.0f);
  pipe_ = std::make_unique<Pipeline>(ptrs, pp > 1 ? g_.pp : nullptr, spec.comm_timeout_s);
  pipe_->set_wait_clock([this] { return zero_->wait_ms() + tp_wait_ms() + cp_wait_ms(); });
}

std::vector<std::string> TrainStep::Fp8EndStep() {
  std::vector<std::string> lines;
  if (!spec_.model.fp8) return lines;
  for (auto& m : models_) {
    std::vector<float> amax = m->Fp8StepAmax();
    // Over the replicas (the dp group spans dp × cp: parallel/groups.cc) and the tensor-parallel
    // shards: every rank holding these blocks judges the same figures, so they fall back
    // together and keep one delayed scale per tensor.
    std::vector<double> wide(amax.begin(), amax.end());
    if (!wide.empty()) g_.dp->AllReduceMax(wide.data(), wide.size());
    if (!wide.empty() && g_.tp && g_.tp->size() > 1) g_.tp->AllReduceMax(wide.data(), wide.size());
    for (size_t i = 0; i < amax.size(); ++i) amax[i] = float(wide[i]);
    for (std::string& line : m->Fp8EndStep(amax)) lines.push_back(std::move(line));
  }
  return lines;
}

int TrainStep::fp8_blocks() {
  double n = 0;
  for (auto& m : models_) n += m->fp8_blocks();
  if (g_.pp && g_.pp->size() > 1) n = g_.pp->AllReduceSum(n);
  return int(n);
}

TrainStep::~TrainStep() {
  // Transfers in flight write into the models' arenas. If one does not end (a lost peer; the
  // process is on its way to exit 75), the arenas are leaked on purpose rather than freed under
  // MPI, as ZeroStrategy does with its buffers.
  if (!pipe_->Quiesce())
    for (auto& m : models_) (void)m.release();
}

void TrainStep::BeforeSave() {
  if (outer_) outer_->Settle();
  float* at = fp8_saved_.data();
  for (auto& m : models_) {
    m->Fp8SaveState(at);
    at += m->Fp8StateFloats();
  }
}

std::string TrainStep::Fp8OwnName() const {
  return OwnName("fp8.trackers.n" + std::to_string(fp8_saved_.size()));
}

void TrainStep::Restored(int optimizer_step, int step_done,
                         const std::vector<std::string>& own_missing, int saved_replicas) {
  store_->set_step(optimizer_step);
  if (!fp8_saved_.empty()) {
    // Found: the scales, spike tests and fallbacks go on where they were. Else (another layout,
    // a run that was not fp8) the trackers start afresh, which the start says.
    if (std::find(own_missing.begin(), own_missing.end(), Fp8OwnName()) == own_missing.end()) {
      const float* at = fp8_saved_.data();
      for (auto& m : models_) {
        m->Fp8LoadState(at);
        at += m->Fp8StateFloats();
      }
    } else if (comm_.rank() == 0 && (!g_.tp || g_.tp->rank() == 0) &&
               (!g_.pp || g_.pp->rank() == 0)) {
      Log("keel: fp8: the checkpoint holds no tracker state for this layout: the amax "
          "histories start afresh (scales as the recipe's first steps)");
    }
  }
  if (outer_) {
    auto found = [&](const char* what) {
      const std::string mine = OwnName(std::string("diloco.") + what);
      return std::find(own_missing.begin(), own_missing.end(), mine) == own_missing.end();
    };
    const std::string tag = std::string(".") + outer_->InFlightTag();
    outer_->Loaded(step_done, found("master"),
                   found(("sends" + tag).c_str()) && found(("arrived" + tag).c_str()));
    const int now = comm_.size();
    // Replica 0 always finds its own state in a DiLoCo checkpoint saved at another width (not
    // in a synchronous run's, which the checkpointer's line covers).
    if (saved_replicas > 0 && saved_replicas != now && found("master") && comm_.rank() == 0 &&
        (!g_.pp || g_.pp->rank() == 0)) {
      // "replica 1 joins", "replicas 1-3 join"
      auto span = [](int a, int b, const char* one, const char* many) {
        return b - a == 1
                   ? "replica " + std::to_string(a) + " " + one
                   : "replicas " + std::to_string(a) + "-" + std::to_string(b - 1) + " " + many;
      };
      const std::string kept = span(0, std::min(saved_replicas, now), "goes on with its round",
                                    "go on with their rounds");
      const std::string rest =
          now < saved_replicas
              ? span(now, saved_replicas, "is dropped from its round", "are dropped from theirs")
              : span(saved_replicas, now, "joins", "join") +
                    " from the anchor (the replicas' common weights) with the outer momentum";
      Log("keel: DiLoCo: the checkpoint's %d replica(s) go on as %d: %s; %s", saved_replicas, now,
          kept.c_str(), rest.c_str());
    }
  }
  // bf16 working weights: the rounding of the restored master, exactly (without a master they
  // were loaded in place).
  zero_->PublishWeights();
}

void TrainStep::SumTiedGrads() {
  tied_ms_ = 0;
  tied_bytes_ = 0;
  if (!g_.tied || g_.tied->size() < 2 || !spec_.model.tied()) return;
  // ZeRO 0 and 1 (the only stages pipelines take) keep every gradient: wte is whole on both.
  const model::ParamInfo& wte = layout_.Find("wte.weight");
  if (wte.grad_offset == SIZE_MAX) return;  // frozen (LoRA): no gradient
  tied_ms_ =
      SumGradRanges(*g_.tied, {{wte.grad_offset, wte.numel}}, "the tied embedding's gradient sum");
  tied_bytes_ = 4.0 * double(wte.numel);
}

// Gradients each tp rank holds whole but computed only part of, summed over the group where this
// rank holds them (the dp-reduced gradients, or its ZeRO 2/3 slice, which its tp peers hold alike:
// their layouts have the same sizes): under sequence parallelism the LayerNorms' (each rank saw
// its rows of the sequence), and a LoRA adapter's whole factor (the A of a column-parallel
// product, which each rank's output rows contribute to; the B of a row-parallel one, whose input
// each rank holds a slice of the columns of).
void TrainStep::SumTpPartialGrads() {
  if (!g_.tp || g_.tp->size() < 2) return;
  const size_t lo = store_->grads_lo(), hi = lo + store_->grads_size();
  std::vector<std::pair<size_t, size_t>> ranges;  // [at, n) of the store's gradients
  for (const model::ParamInfo& p : layout_.params()) {
    // A LoRA layout's frozen norms have only a scratch (past grad_trained): nothing to sum.
    if (p.grad_offset >= layout_.grad_trained()) continue;
    const bool partial =
        model::IsLoraParam(p.name) ? p.tp_axis < 0 : spec_.layout.sp && model::NormParam(p);
    if (!partial) continue;
    const size_t a = std::max(lo, p.grad_offset), b = std::min(hi, p.grad_offset + p.numel);
    if (a >= b) continue;
    ranges.emplace_back(a - lo, b - a);
    tp_sum_bytes_ += 4.0 * double(b - a);
  }
  tp_sum_ms_ += SumGradRanges(*g_.tp, ranges, "a tensor-parallel gradient sum");
}

double TrainStep::SumGradRanges(parallel::Comm& c,
                                const std::vector<std::pair<size_t, size_t>>& ranges,
                                const char* what) {
  const bool wide = store_->grad_dtype() != DType::kF32;
  const size_t cap = wide ? sum_scratch_.bytes() / 4 : SIZE_MAX;
  KEEL_CHECK(cap > 0, "TrainStep: bf16 gradient sums without their scratch");
  std::vector<GradSum> ops;
  size_t used = 0;
  double ms = 0;
  auto finish = [&] {
    for (GradSum& g : ops) ms += FinishGradSum(g, be_, spec_.comm_timeout_s, what);
    ops.clear();
    used = 0;
  };
  for (auto [at, n] : ranges)
    while (n > 0) {  // each piece its own part of the scratch: a round's sums run at once
      if (used == cap) finish();
      const size_t k = std::min(n, cap - used);
      ops.push_back(
          StartGradSum(c, *store_, at, k, wide ? sum_scratch_.as<float>() + used : nullptr));
      if (wide) used += k;
      at += k;
      n -= k;
    }
  finish();
  return ms;
}

double TrainStep::tp_wait_ms() const {
  double ms = tp_sum_ms_;
  for (const auto& m : models_) ms += m->tp_wait_ms();
  return ms;
}

double TrainStep::head_ms() const {
  double ms = 0;
  for (const auto& m : models_) ms += m->head_ms();
  return ms;
}

double TrainStep::tp_bytes() const {
  double b = tp_sum_bytes_;
  for (const auto& m : models_) b += m->tp_bytes();
  return b;
}

double TrainStep::cp_wait_ms() const {
  double ms = 0;
  for (const auto& m : models_) ms += m->cp_wait_ms();
  return ms;
}

double TrainStep::cp_bytes() const {
  double b = 0;
  for (const auto& m : models_) b += m->cp_bytes();
  return b;
}

double TrainStep::ForwardBackward(int n_micro, const NextBatch& next, float dloss,
                                  double* data_ms) {
  for (auto& m : models_) {
    m->ResetStepStats();
    m->SetFp8Observe(true);
  }
  tp_sum_ms_ = tp_sum_bytes_ = 0;
  if (spec_.model.lora_dropout > 0) {
    // This rank's micro-batches are rows [r·n·b, (r + 1)·n·b) of the step's global batch (the
    // loader's split, data/loader.h), each T tokens.
    const uint64_t rows = uint64_t(spec_.layout.micro_batch) * uint64_t(spec_.seq_len);
    pipe_->SetDropout(DropoutKey(spec_.seed, step_index_),
                      uint64_t(comm_.rank()) * uint64_t(n_micro) * rows, rows);
  }
  zero_->BeginStep();
  // Context parallelism: the loader's whole sequences, this rank's two chunks of each kept.
  NextBatch mine = next;
  if (spec_.layout.cp > 1) {
    const size_t n = size_t(spec_.layout.micro_batch) * size_t(spec_.seq_len);
    whole_tokens_.resize(n);
    whole_targets_.resize(n);
    mine = [&](int32_t* tokens, int32_t* targets) {
      const double r = next(whole_tokens_.data(), whole_targets_.data());
      KeepMine(whole_tokens_.data(), whole_targets_.data(), tokens, targets);
      return r;
    };
  }
  double loss = pipe_->Run(
      n_micro, mine, dloss, [&](int k) { zero_->BeginMicroBatch(k == n_micro - 1); }, data_ms);
  zero_->FinishBackward();
  SumTiedGrads();
  SumTpPartialGrads();
  if (g_.pp && g_.pp->size() > 1) loss = g_.pp->AllReduceSum(loss);
  return comm_.AllReduceSum(loss);
}

double TrainStep::GradNorm() {
  double sq = zero_->GradSquares();
  if (g_.pp && g_.pp->size() > 1) sq = g_.pp->AllReduceSum(sq);
  if (g_.tp && g_.tp->size() > 1) sq = g_.tp->AllReduceSum(sq);
  // DiLoCo: the loss's gradient is scaled for the whole group's tokens (1/dp of the replica's
  // own mean), which the replica alone now steps on.
  return std::sqrt(sq) * (outer_ ? comm_.size() : 1);
}

double TrainStep::JudgedNorm(double norm) {
  if (!outer_ || comm_.size() == 1) return norm;
  // The replicas' root mean square: a NaN or Inf anywhere reaches every rank, as a sum does.
  return std::sqrt(comm_.AllReduceSum(norm * norm) / comm_.size());
}

void TrainStep::Apply(float lr, float grad_clip, double norm, double unscale) {
  const double local = outer_ ? comm_.size() : 1;  // as in GradNorm
  zero_->Update(lr, float(optim::ClipScale(norm, grad_clip) * unscale * local));
}

double TrainStep::Update(float lr, float grad_clip, const std::function<void()>& before_update) {
  const double norm = GradNorm();
  if (before_update) before_update();
  Apply(lr, grad_clip, norm);
  return norm;
}

void TrainStep::KeepMine(const int32_t* tokens, const int32_t* targets, int32_t* my_tokens,
                         int32_t* my_targets) const {
  const int B = spec_.layout.micro_batch, T = spec_.seq_len, cp = spec_.layout.cp;
  parallel::ZigzagSlice(tokens, my_tokens, B, T, cp, g_.cp->rank());
  parallel::ZigzagSlice(targets, my_targets, B, T, cp, g_.cp->rank());
}

double TrainStep::Forward(const int32_t* tokens, const int32_t* targets) {
  // A validation pass: fp8 products use the training's scales and leave its amaxes alone.
  for (auto& m : models_) m->SetFp8Observe(false);
  std::vector<int32_t> mine;
  if (spec_.layout.cp > 1) {  // this rank's chunks; the cp ranks' sums add up to the batch's
    const size_t n = size_t(spec_.layout.micro_batch) * size_t(spec_.seq_len / spec_.layout.cp);
    mine.resize(2 * n);
    KeepMine(tokens, targets, mine.data(), mine.data() + n);
    tokens = mine.data(), targets = mine.data() + n;
  }
  const double loss = pipe_->Forward(tokens, targets);
  return layout_.tp().rank == 0 ? loss : 0.0;  // the tp ranks computed the same one
}

ckpt::StateView TrainStep::StateView() {
  ckpt::StateView v;
  v.tensors = ckpt::TensorSpecs(layout_);
  if (!layout_.whole()) v.all_tensors = ckpt::TensorSpecs(model::ParamLayout::Whole(spec_.model));
  if (store_->compact()) {
    // The trainable tensors only, at their places in the packed state; the frozen base is the
    // run's [model] init_from (or its seed's init), named in the manifest's state.base.
    // Packed as the layout packs their gradients (ParamLayout::grad_offset).
    std::vector<ckpt::TensorSpec> mine;
    for (size_t i = 0; i < v.tensors.size(); ++i) {
      const model::ParamInfo& p = layout_.params()[i];
      if (!model::IsLoraParam(p.name)) continue;
      mine.push_back(v.tensors[i]);
      mine.back().offset = p.grad_offset;
    }
    v.tensors = std::move(mine);
    std::erase_if(v.all_tensors,
                  [](const ckpt::TensorSpec& t) { return !model::IsLoraParam(t.name); });
  }
  // Without a master, the bf16 weights stand for it; bf16 buffers are saved widened (ckpt/state.h).
  using Kind = optim::ParamStore::Kind;
  v.buffers = {{"master", store_->master_data(), store_->master_dtype()},
               {"adam_m", store_->adam_m(), store_->moment_dtype()},
               {"adam_v", store_->adam_v(), store_->moment_dtype()}};
  // What an offload tier holds is read and written through the store (element 0 is v.lo).
  for (Kind k : {Kind::kMaster, Kind::kM, Kind::kV}) {
    if (!store_->offloaded(k)) continue;
    ckpt::FlatBuffer& b = v.buffers[size_t(k)];
    optim::ParamStore* st = store_.get();
    b.read = [st, k](size_t at, size_t n, void* host) { st->ReadState(k, at, n, host); };
    b.write = [st, k](size_t at, size_t n, const void* host) { st->WriteState(k, at, n, host); };
  }
  v.lo = store_->state_lo();
  v.hi = spec_.layout.zero >= 1 ? store_->state_hi() : 0;
  // The stage's data-parallel ranks split its tensors for writing (ZeRO 1+: their shards).
  v.part = comm_.rank();
  v.parts = comm_.size();
  if (outer_) {
    // DiLoCo: the checkpoint's model is the replicas' common one, the anchor (so that exports,
    // evaluations and other layouts read it); each replica's own weights, moments and outer
    // state are its own tensors, for a resume under the same layout that goes on bitwise. The
    // moments' shared copy is pieced from the replicas' (one part each) for the other layouts.
    v.buffers[0] = {"master", outer_->anchor(), DType::kF32};
    const size_t n = outer_->size();
    // Saved by another number of replicas (the supervisor's elastic dp lost or regained a host),
    // replica r goes on with the round of the one saved as replica r, and the replicas past the
    // new width are dropped from theirs; one the checkpoint lacks starts from the anchor, with the
    // outer momentum, which every replica holds alike. Fragments in flight are not carried over:
    // their names hold the width, so every replica drops them together.
    const std::string kept = std::to_string(comm_.rank()) + "of*";
    auto own = [&](const char* what, void* p, bool keep = false, const std::string& from = "") {
      const std::string w = std::string("diloco.") + what;
      v.own.push_back(
          {OwnName(w), static_cast<float*>(p), n, keep, from.empty() ? "" : OwnName(w, from)});
    };
    // Without it Restored starts the replica from the anchor.
    own("master", store_->master_data(), /*keep=*/true, kept);
    // Without them the replica keeps the moments pieced from the shared ones: not zeroed.
    own("adam_m", store_->adam_m(), true, kept);
    own("adam_v", store_->adam_v(), true, kept);
    own("momentum", outer_->momentum(), false, "*of*");
    if (outer_->residual()) own("residual", outer_->residual(), false, kept);
    if (spec_.diloco.overlap_steps > 0) {
      // The fragments in flight: each replica's sends and the averages to land (Run::SaveView
      // waits for them to arrive first).
      const std::string tag = std::string(".") + outer_->InFlightTag();
      own(("sends" + tag).c_str(), outer_->sends(), true);
      own(("arrived" + tag).c_str(), outer_->arrived(), true);
    }
  }
  if (zero_->residual_elems() > 0)
    v.own.push_back(
        {OwnName("grad_comm.residual"), zero_->residual(), zero_->residual_elems(), false, ""});
  // Kept when missing: Restored says the trackers start afresh.
  if (!fp8_saved_.empty())
    v.own.push_back({Fp8OwnName(), fp8_saved_.data(), fp8_saved_.size(), /*keep=*/true, ""});
  return v;
}

std::string TrainStep::OwnName(const std::string& what, const std::string& dp_part) const {
  auto at = [](const parallel::Comm* c, const char* dim) {
    const int r = c ? c->rank() : 0, n = c ? c->size() : 1;
    return std::string(".") + dim + std::to_string(r) + "of" + std::to_string(n);
  };
  return what + (dp_part.empty() ? at(&comm_, "dp") : ".dp" + dp_part) + at(g_.tp, "tp") +
         at(g_.pp, "pp");
}

size_t TrainStep::ActivationBytes() const {
  size_t b = 0;
  for (const auto& m : models_) b += m->activation_plan().total_bytes;
  return b;
}

nlohmann::json TrainStep::MemoryBytes() const {
  const parallel::StateBytes b = store_->bytes();
  return {{"master", b.master},
          {"working", b.working},
          {"biases", b.biases},
          {"quantized_base", b.quantized},
          {"grads", b.grads},
          {"adam_moments", b.moments},
          {"zero_buffers",
           zero_->buffer_bytes() + sum_scratch_.bytes() + (outer_ ? outer_->bytes() : 0)},
          {"offload_buffers", b.offload_buffers},
          {"activations", ActivationBytes()}};
}

}  // namespace keel::train
