#include "keel/train/zero.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "keel/core/error.h"
#include "keel/model/params.h"
#include "keel/model/quantize.h"
#include "keel/model/segment_pack.h"
#include "keel/model/working_copy.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/wire_reduce.h"

namespace keel::train {

// A segment-sized buffer of the strategy: gradient scratch (reduce-scattered in place: this
// rank's part lands at its start) or gathered weights; `seg` is the segment it holds or reduces.
struct ZeroStrategy::Slot {
  Buffer buf;
  int seg = -1;
  std::unique_ptr<parallel::Work> op;
  size_t dst = 0, n = 0;  // gradients: buf[0, n) adds into the shard at dst
  // Weights on the offload tier: this rank's part is being read into buf (the ticket); the
  // all-gather starts once it is in (StartGather).
  bool reading = false;
  uint64_t read = 0;
};

ZeroStrategy::ZeroStrategy(optim::ParamStore& store, const model::ParamLayout& layout,
                           parallel::Comm& comm, size_t bucket_elems, double timeout_s,
                           parallel::GradWire wire, bool local)
    : store_(store),
      layout_(layout),
      comm_(comm),
      zero_(store.dims().zero),
      dp_(store.dims().replicas()),
      bf16_grads_(store.grad_dtype() == DType::kBF16),
      packed_(store.compact() && zero_ >= 3),
      wire_(wire),
      local_(local),
      L_(layout.segments() - 2),
      timeout_s_(timeout_s),
      fresh_(size_t(layout.segments()), 0) {
  KEEL_CHECK(comm.size() == dp_, "ZeroStrategy: the communicator is not the data-parallel group");
  KEEL_CHECK(!local || (zero_ == 0 && !bf16_grads_), "ZeroStrategy: local gradients are ZeRO 0's");
  if (store.compact()) {
    std::unordered_map<size_t, size_t> bias_at;  // layout offset → fp32 copy index
    for (const model::ParamInfo& p : layout.params())
      if (p.bias_index != SIZE_MAX) bias_at.emplace(p.offset, p.bias_index);
    for (const optim::ParamRange& r : store.trainable())
      if (auto it = bias_at.find(r.at); it != bias_at.end())
        trained_biases_.push_back({it->second, r.offset, r.numel});
  }
  parallel::StateShape sh = model::StateShapeOf(layout, store.dtype());
  sh.grad_comm = wire;
  if (const size_t n = parallel::GradResidualElems(sh, store.dims())) {
    residual_ = Buffer(store.backend(), 4 * n);
    store.backend().Zero(residual_.data(), 4 * n);
  }
  if (packed_) {
    packs_ = model::SegmentPacks(layout, store.dtype());
    own_ = parallel::Shard(model::PackedBytes(packs_) / 4, dp_, comm.rank());
    seg_trained_.assign(size_t(layout.segments()), 0);
    for (const optim::ParamRange& r : store.trainable()) {
      const model::ParamInfo* p = nullptr;
      for (const model::ParamInfo& q : layout.params())
        if (q.offset == r.at) p = &q;
      KEEL_CHECK(p && !p->quantized(), "ZeroStrategy: a trainable range is no working tensor");
      const int seg = model::SegmentOf(layout, *p);
      trained_at_.push_back(packs_[size_t(seg)].start +
                            model::PackWorkAt(layout, store.dtype(), seg, *p));
      seg_trained_[size_t(seg)] = 1;
    }
  }
  if ((zero_ < 2 || packed_) && !bf16_grads_) {
    // Stages 0 and 1 hold every gradient, so the frozen ranges are flat indices; adjacent ones
    // merge into one.
    std::vector<std::pair<size_t, size_t>> frozen;
    for (const optim::ParamRange& r : store.frozen_grads()) {
      if (!frozen.empty() && frozen.back().second == r.offset)
        frozen.back().second += r.numel;
      else
        frozen.emplace_back(r.offset, r.offset + r.numel);
    }
    sync_ =
        std::make_unique<GradSync>(comm, static_cast<float*>(store.grads()), layout.grad_trained(),
                                   bucket_elems, timeout_s, std::move(frozen), wire, residual());
  }
  // Slots 0 and 1: the embeddings and the final LayerNorm (where this stage holds them); 2 and 3:
  // blocks by parity, so that the block in use and the next one (prefetched, or still reducing)
  // never share a buffer. Sized by the state's shape, as the planner sizes them.
  const size_t sizes[4] = {sh.embed, sh.final_norm, sh.max_block, sh.max_block};
  size_t packed[4] = {0, 0, 0, 0};  // a compact state's: the slots' packs, in bytes
  if (packed_) {
    const int e = layout.embed_segment(), f = layout.final_segment();
    packed[0] = e < 0 ? 0 : packs_[size_t(e)].bytes;
    packed[1] = f < 0 ? 0 : packs_[size_t(f)].bytes;
    packed[2] = packed[3] = (sh.packed_slots - packed[0] - packed[1]) / 2;
  }
  for (size_t i = 0; i < 4; ++i) {
    const size_t n = sizes[i];
    if ((zero_ >= 2 && !packed_) || bf16_grads_) {
      auto g = std::make_unique<Slot>();
      g->buf = Buffer(store.backend(), 4 * n);
      grad_slots_.push_back(std::move(g));
    }
    if (zero_ >= 3) {
      auto w = std::make_unique<Slot>();
      w->buf = Buffer(store.backend(), packed_ ? packed[i] : ElemBytes() * n);
      weight_slots_.push_back(std::move(w));
    }
  }
}

ZeroStrategy::~ZeroStrategy() {
  // Operations still queued write into the slots: let them finish before the buffers go. One that
  // does not (a lost peer; the process is on its way to exit 75) keeps its buffer, leaked on
  // purpose, so that a late write lands in memory nobody else uses.
  const Timer since;
  bool unsettled = sync_ && !sync_->idle();
  for (auto* slots : {&grad_slots_, &weight_slots_})
    for (auto& s : *slots)
      if (s->op && !parallel::Settled(*s->op, since, timeout_s_)) {
        new Buffer(std::move(s->buf));
        unsettled = true;
      }
  // int8's sums write the residual until they finish (their last encoding): kept the same way.
  if (unsettled && residual_.bytes()) new Buffer(std::move(residual_));
  // A tier read still queued writes into its slot too.
  for (auto& s : weight_slots_)
    if (s->reading) try {
        store_.WaitState(s->read);
      } catch (...) {  // the tier failed; the run is ending with that error already
      }
}

size_t ZeroStrategy::ElemBytes() const { return store_.dtype() != DType::kF32 ? 2 : 4; }

size_t ZeroStrategy::buffer_bytes() const {
  size_t b = 0;
  for (auto* slots : {&grad_slots_, &weight_slots_})
    for (auto& s : *slots) b += s->buf.bytes();
  return b + residual_.bytes();
}

std::vector<size_t> ZeroStrategy::Counts(size_t a, size_t b, size_t n) const {
  std::vector<size_t> c(static_cast<size_t>(dp_));
  for (int r = 0; r < dp_; ++r) {
    const parallel::ShardRange s = parallel::Shard(n ? n : store_.total(), dp_, r);
    const size_t lo = std::max(a, s.lo), hi = std::min(b, s.hi);
    c[size_t(r)] = hi > lo ? hi - lo : 0;
  }
  return c;
}

void ZeroStrategy::Wait(parallel::Work& w, const char* what) {
  wait_ms_ += parallel::WaitOrLost(w, timeout_s_, what);
}

size_t ZeroStrategy::SlotOf(int s) const {
  return s == layout_.embed_segment() ? 0 : s == layout_.final_segment() ? 1 : size_t(2 + s % 2);
}
ZeroStrategy::Slot& ZeroStrategy::GradSlot(int s) { return *grad_slots_[SlotOf(s)]; }
ZeroStrategy::Slot& ZeroStrategy::WeightSlot(int s) { return *weight_slots_[SlotOf(s)]; }

void ZeroStrategy::Gather(int s, Slot& slot) {
  if (slot.op) Wait(*slot.op, "parameter all-gather");
  slot.op.reset();
  if (slot.reading) store_.WaitState(slot.read);  // a prefetch nobody used: let it land first
  slot.reading = false;
  const size_t a = layout_.segment_start(s), b = layout_.segment_end(s);
  const size_t from = std::clamp(a, store_.shard().lo, store_.shard().hi) - store_.working_lo();
  slot.seg = s;
  if (packed_) {
    // The segment's pack, as 4-byte words of the packed copy that each rank holds a shard of.
    const size_t wa = packs_[size_t(s)].start / 4, wb = wa + packs_[size_t(s)].bytes / 4;
    const size_t words = model::PackedBytes(packs_) / 4;
    const size_t own = std::clamp(wa, own_.lo, own_.hi) - own_.lo;
    sent_bytes_ += 4.0 * double(wb - wa) * (dp_ - 1) / dp_;
    slot.op = comm_.AllGatherAsync(static_cast<const float*>(store_.working()) + own,
                                   slot.buf.data(), Counts(wa, wb, words), DType::kF32);
    return;
  }
  sent_bytes_ += double(b - a) * ElemBytes() * (dp_ - 1) / dp_;
  if (store_.offloaded(optim::ParamStore::Kind::kWorking)) {
    // This rank's part is read into its place in the gathered segment by the tier's I/O thread,
    // behind the compute; the in-place all-gather follows when the segment is next asked for.
    const size_t n = Counts(a, b)[size_t(comm_.rank())];
    char* mine = slot.buf.as<char>() + OwnAt(s) * ElemBytes();
    slot.read = n ? store_.ReadWorkingAsync(from, n, mine) : 0;
    slot.reading = true;
    return;
  }
  slot.op = comm_.AllGatherAsync(static_cast<const char*>(store_.working()) + from * ElemBytes(),
                                 slot.buf.data(), Counts(a, b), store_.dtype());
}

size_t ZeroStrategy::OwnAt(int s) const {
  const std::vector<size_t> counts = Counts(layout_.segment_start(s), layout_.segment_end(s));
  size_t at = 0;
  for (int r = 0; r < comm_.rank(); ++r) at += counts[size_t(r)];
  return at;
}

void ZeroStrategy::StartGather(Slot& slot) {
  if (!slot.reading) return;
  store_.WaitState(slot.read);
  slot.reading = false;
  const size_t a = layout_.segment_start(slot.seg), b = layout_.segment_end(slot.seg);
  slot.op = comm_.AllGatherAsync(slot.buf.as<char>() + OwnAt(slot.seg) * ElemBytes(),
                                 slot.buf.data(), Counts(a, b), store_.dtype());
}

const void* ZeroStrategy::Weights(int s) {
  if (zero_ < 3) {
    const size_t at = layout_.segment_work_start(s) - store_.working_lo();
    return static_cast<const char*>(store_.working()) + at * ElemBytes();
  }
  Slot& slot = WeightSlot(s);
  if (slot.seg != s) Gather(s, slot);  // a caller that skipped Use
  StartGather(slot);
  if (slot.op) {
    Wait(*slot.op, "parameter all-gather");
    slot.op.reset();
  }
  return slot.buf.data();
}

const float* ZeroStrategy::Biases() { return store_.biases(); }

model::QuantizedWeights ZeroStrategy::Quantized(int s) {
  if (packed_) {
    const char* pack = static_cast<const char*>(Weights(s));
    return {reinterpret_cast<const uint8_t*>(pack + packs_[size_t(s)].codes),
            reinterpret_cast<const float*>(pack + packs_[size_t(s)].scales)};
  }
  if (!store_.codes()) return {};
  return {store_.codes() + model::CodeByte(layout_.base_quant(), layout_.segment_quant_start(s)),
          store_.scales() + layout_.segment_scale_start(s)};
}

void ZeroStrategy::Use(int s, model::Pass p) {
  if (zero_ < 3) return;
  Slot& slot = WeightSlot(s);
  if (slot.seg != s) Gather(s, slot);
  StartGather(slot);
  // The next block's gather runs on the comm thread (with the weights on the tier: its read, on
  // the tier's I/O thread) while this one computes. Nothing is freed at
  // Done: a block's weights stay in their slot until the block two ahead needs it, so a backward
  // that follows its forward directly reuses the last block's.
  const int next = p == model::Pass::kForward ? s + 1 : s - 1;
  if (next >= 1 && next <= L_) {
    Slot& n = WeightSlot(next);
    if (&n != &slot && n.seg != next) Gather(next, n);
  }
}

float* ZeroStrategy::Grads(int s) {
  if (sync_) return static_cast<float*>(store_.grads()) + layout_.segment_grad_start(s);
  Slot& slot = GradSlot(s);
  if (!fresh_[size_t(s)]) {
    Drain(slot);
    store_.backend().Zero(slot.buf.data(), 4 * layout_.segment_size(s));
    fresh_[size_t(s)] = 1;
  }
  return slot.buf.as<float>();
}

void ZeroStrategy::GradsDone(int s) {
  if (sync_) {
    if (last_micro_ && !local_) sync_->Ready(layout_.segment_grad_start(s));
    return;
  }
  Slot& slot = GradSlot(s);
  fresh_[size_t(s)] = 0;
  if (zero_ < 2) return BucketDone(s, slot);
  const size_t a = layout_.segment_start(s), b = layout_.segment_end(s);
  std::vector<size_t> counts = Counts(a, b);
  slot.n = counts[size_t(comm_.rank())];
  slot.dst = std::clamp(a, store_.shard().lo, store_.shard().hi) - store_.grads_lo();
  slot.seg = s;
  float* err = residual_.bytes() ? residual() + a : nullptr;
  slot.op = parallel::ReduceScatterOnWire(comm_, wire_, slot.buf.as<float>(), counts, err);
  SentGrads(parallel::WireSentBytes(wire_, b - a, dp_, /*all_reduce=*/false));
}

void ZeroStrategy::BucketDone(int s, Slot& slot) {
  // Stages 0 and 1 with bf16 gradients: the segment's fp32 bucket into the whole bf16 buffer,
  // rounded once per micro-batch; on the last one, with peers, the sum travels in fp32 (this
  // rank's bf16 part widened into the bucket) and is rounded once, when it lands (Drain).
  const kernels::Backend& be = store_.backend();
  const size_t a = layout_.segment_start(s), n = layout_.segment_size(s);
  bf16* acc = static_cast<bf16*>(store_.grads()) + a;
  if (!last_micro_ || dp_ == 1) return be.AccumulateBf16(acc, slot.buf.as<float>(), n);
  be.AddBf16To(slot.buf.as<float>(), acc, n);
  float* err = residual_.bytes() ? residual() + a : nullptr;
  slot.op = parallel::AllReduceOnWire(comm_, wire_, slot.buf.as<float>(), n, err);
  slot.dst = a;
  slot.n = n;
  slot.seg = s;
  SentGrads(parallel::WireSentBytes(wire_, n, dp_, /*all_reduce=*/true));
}

void ZeroStrategy::Drain(Slot& slot) {
  if (!slot.op) return;
  const bool reduced_whole = zero_ < 2;  // all-reduced bf16 buckets (BucketDone)
  Wait(*slot.op, reduced_whole ? "gradient all-reduce" : "gradient reduce-scatter");
  slot.op.reset();
  const kernels::Backend& be = store_.backend();
  const float* x = slot.buf.as<float>();
  if (reduced_whole)
    be.ToBf16(static_cast<bf16*>(store_.grads()) + slot.dst, x, slot.n);
  else if (bf16_grads_)
    be.AccumulateBf16(static_cast<bf16*>(store_.grads()) + slot.dst, x, slot.n);
  else
    be.AddTo(static_cast<float*>(store_.grads()) + slot.dst, x, slot.n);
}

void ZeroStrategy::BeginStep() {
  wait_ms_ = 0;
  sent_bytes_ = grad_sent_bytes_ = 0;
  store_.backend().Zero(store_.grads(), DTypeSize(store_.grad_dtype()) * store_.grads_size());
  std::fill(fresh_.begin(), fresh_.end(), 0);
  if (sync_) sync_->Begin();
}

void ZeroStrategy::BeginMicroBatch(bool last) { last_micro_ = last; }

void ZeroStrategy::FinishBackward() {
  if (sync_) {
    if (local_) return;
    sync_->Finish();
    wait_ms_ += sync_->wait_ms();
    SentGrads(parallel::WireSentBytes(wire_, sync_->reduced(), dp_, /*all_reduce=*/true));
    return;
  }
  for (auto& s : grad_slots_) Drain(*s);
}

double ZeroStrategy::GradSquares() {
  store_.ZeroFrozenGrads();
  double sq = store_.LocalGradSquares();
  if (zero_ >= 1) sq = comm_.AllReduceSum(sq);
  return sq;
}

void ZeroStrategy::PublishBiases() {
  if (store_.dtype() == DType::kF32) return;
  float* b = store_.biases();
  const size_t lo = store_.state_lo(), hi = store_.state_hi();
  if (zero_ >= 1) store_.backend().Zero(b, 4 * layout_.n_bias());
  for (const model::ParamInfo& p : layout_.params()) {
    if (p.bias_index == SIZE_MAX) continue;
    const size_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (a >= e) continue;
    if (store_.offloaded(optim::ParamStore::Kind::kMaster)) {  // through host memory
      std::vector<float> host(e - a);
      if (store_.has_master()) {
        store_.ReadState(optim::ParamStore::Kind::kMaster, a - lo, e - a, host.data());
      } else {  // the tier's bf16 weights, widened exactly
        std::vector<bf16> w(e - a);
        store_.ReadState(optim::ParamStore::Kind::kMaster, a - lo, e - a, w.data());
        ConvertBf16ToF32(host.data(), w.data(), w.size());
      }
      store_.backend().FromHost(b + p.bias_index + (a - p.offset), host.data(), 4 * (e - a));
    } else if (store_.has_master())
      store_.backend().Copy(b + p.bias_index + (a - p.offset), store_.master() + (a - lo),
                            4 * (e - a));
    else  // the bf16 weights are the only copy: their exact widening
      store_.backend().ToF32(b + p.bias_index + (a - p.offset),
                             static_cast<const bf16*>(store_.master_data()) + (a - lo), e - a);
  }
  // Each element comes from exactly one rank and is zero elsewhere: the sum is exact.
  if (zero_ >= 1) {
    auto w = comm_.AllReduceSumAsync(b, layout_.n_bias(), DType::kF32);
    Wait(*w, "bias all-reduce");
  }
}

void ZeroStrategy::PublishWeights() {
  if (store_.compact()) return PublishCompact();
  const size_t lo = store_.state_lo();
  // Without a master the slice already holds the weights (set or loaded in place).
  using Kind = optim::ParamStore::Kind;
  if (store_.dtype() != DType::kF32 && store_.has_master()) {
    // Into the tier's region through host memory where it holds the working weights.
    const bool on_tier = store_.offloaded(Kind::kWorking);
    std::vector<char> piece;
    char* w = on_tier
                  ? nullptr
                  : static_cast<char*>(store_.working()) + ElemBytes() * (lo - store_.working_lo());
    store_.VisitState(Kind::kMaster, false, [&](void* p, size_t l, size_t n) {
      piece.resize(on_tier ? ElemBytes() * n : 0);
      store_.backend().Narrow(store_.dtype(), on_tier ? piece.data() : w + ElemBytes() * l,
                              static_cast<const float*>(p), n);
      if (on_tier) store_.WriteState(Kind::kWorking, l, n, piece.data());
    });
  }
  Publish();
}

void ZeroStrategy::PublishWeights(size_t lo, size_t hi) {
  using Kind = optim::ParamStore::Kind;
  if (zero_ != 0 || store_.compact() || !store_.has_master() || store_.offloaded(Kind::kMaster) ||
      store_.offloaded(Kind::kWorking))
    return PublishWeights();
  if (store_.dtype() != DType::kF32) {
    // State element l sits at working element state_lo + l (PublishWeights' VisitState places).
    char* w = static_cast<char*>(store_.working()) +
              ElemBytes() * (store_.state_lo() + lo - store_.working_lo());
    store_.backend().Narrow(store_.dtype(), w, static_cast<const float*>(store_.master_data()) + lo,
                            hi - lo);
  }
  Publish();
}

void ZeroStrategy::Update(float lr, float grad_scale) {
  store_.Update(lr, grad_scale);  // also rounds this rank's slice into the bf16 working copy
  if (store_.compact()) return PublishCompact(/*adapters_only=*/true);
  Publish();
}

const float* ZeroStrategy::AllCompactMaster(Buffer& tmp) {
  if (zero_ == 0) return store_.master();
  const size_t n = store_.state_total();
  tmp = Buffer(store_.backend(), 4 * n);
  auto w = comm_.AllGatherAsync(store_.master(), tmp.data(), Counts(0, n, n), DType::kF32);
  Wait(*w, "parameter all-gather");
  sent_bytes_ += 4.0 * double(n) * (dp_ - 1) / dp_;
  return tmp.as<float>();
}

void ZeroStrategy::PublishCompact(bool adapters_only) {
  const kernels::Backend& be = store_.backend();
  Buffer tmp;
  const float* all = AllCompactMaster(tmp);
  if (packed_) {
    // Each trained tensor's elements that fall in this rank's shard of the packed copy. Shards
    // cut at 4-byte words and every piece starts on 64 bytes: no element is split.
    const size_t eb = ElemBytes(), lo = 4 * own_.lo, hi = 4 * own_.hi;
    for (size_t i = 0; i < trained_at_.size(); ++i) {
      const optim::ParamRange& r = store_.trainable()[i];
      const size_t a = std::max(lo, trained_at_[i]),
                   e = std::min(hi, trained_at_[i] + eb * r.numel);
      if (a >= e) continue;
      char* dst = static_cast<char*>(store_.working()) + (a - lo);
      const float* src = all + r.offset + (a - trained_at_[i]) / eb;
      if (store_.dtype() != DType::kF32)
        be.Narrow(store_.dtype(), dst, src, (e - a) / eb);
      else
        be.Copy(dst, src, e - a);
    }
    // Gathered again, with the new adapters; a segment without any (the embeddings, the final
    // norm and lm_head) stays as gathered, its frozen weights unchanged by an update.
    for (auto& s : weight_slots_)
      if (!adapters_only || (s->seg >= 0 && seg_trained_[size_t(s->seg)])) s->seg = -1;
  } else {
    for (const optim::ParamRange& r : store_.trainable()) {
      if (store_.dtype() != DType::kF32)
        be.Narrow(store_.dtype(), static_cast<char*>(store_.working()) + ElemBytes() * r.work,
                  all + r.offset, r.numel);
      else
        be.Copy(static_cast<float*>(store_.working()) + r.work, all + r.offset, 4 * r.numel);
    }
  }
  if (store_.dtype() == DType::kF32) return;
  for (const TrainedBias& b : trained_biases_)
    be.Copy(store_.biases() + b.bias, all + b.master, 4 * b.numel);
}

void ZeroStrategy::Publish() {
  if (zero_ == 1 || zero_ == 2) {
    // bf16: each rank's rounded slice is already at its place; fp32: from the master shard.
    const void* send = store_.dtype() != DType::kF32
                           ? static_cast<const void*>(static_cast<char*>(store_.working()) +
                                                      ElemBytes() * store_.state_lo())
                           : static_cast<const void*>(store_.master());
    auto w =
        comm_.AllGatherAsync(send, store_.working(), Counts(0, store_.total()), store_.dtype());
    Wait(*w, "parameter all-gather");
    sent_bytes_ += double(store_.total()) * ElemBytes() * (dp_ - 1) / dp_;
  }
  for (auto& s : weight_slots_) s->seg = -1;  // stage 3 gathers the new weights when used
  PublishBiases();
}

std::vector<float> ZeroStrategy::GatherMaster() {
  const kernels::Backend& be = store_.backend();
  std::vector<float> full(store_.total());
  if (store_.compact()) {
    // The frozen weights from the working copy and a quantized base (the values the model
    // computed with) and the fp32 biases, then the trainable ones from the master. Read in place
    // where the backend's memory is the host's (a 3B base: 6 GB not staged).
    // ZeRO 3: the packed copy gathered, then laid out as one rank's.
    const bool host = be.host_visible() && !packed_;
    const size_t wbytes = layout_.work_total() * ElemBytes();
    std::vector<char> w(host ? 0 : wbytes);
    std::vector<uint8_t> codes(host ? 0 : layout_.quant_code_bytes());
    std::vector<float> scales(host ? 0 : layout_.quant_scales());
    if (packed_) {
      const size_t words = model::PackedBytes(packs_) / 4;
      Buffer gathered(be, 4 * words);
      auto op = comm_.AllGatherAsync(store_.working(), gathered.data(), Counts(0, words, words),
                                     DType::kF32);
      Wait(*op, "weight all-gather");
      std::vector<char> staged(be.host_visible() ? 0 : 4 * words);
      if (!staged.empty()) be.ToHost(staged.data(), gathered.data(), staged.size());
      model::UnpackSegments(layout_, store_.dtype(), packs_,
                            staged.empty() ? gathered.as<char>() : staged.data(), w.data(),
                            codes.data(), scales.data());
    } else if (!host) {
      be.ToHost(w.data(), store_.working(), wbytes);
      be.ToHost(codes.data(), store_.codes(), codes.size());
      be.ToHost(scales.data(), store_.scales(), 4 * scales.size());
    }
    model::ReadWorking(layout_, store_.dtype(), host ? store_.working() : w.data(),
                       host ? store_.codes() : codes.data(), host ? store_.scales() : scales.data(),
                       full.data());
    if (store_.dtype() != DType::kF32) {
      std::vector<float> b(layout_.n_bias());
      be.ToHost(b.data(), store_.biases(), 4 * b.size());
      // host: the gathered copy is built in host memory
      for (const model::ParamInfo& p : layout_.params())
        if (p.bias_index != SIZE_MAX)
          std::copy_n(b.data() + p.bias_index, p.numel, full.data() + p.offset);
    }
    Buffer tmp;
    const float* all = AllCompactMaster(tmp);
    std::vector<float> trained(store_.state_total());
    be.ToHost(trained.data(), all, 4 * trained.size());
    // host: as above
    for (const optim::ParamRange& r : store_.trainable())
      std::copy_n(trained.data() + r.offset, r.numel, full.data() + r.at);
    return full;
  }
  if (!store_.has_master()) {
    // The bf16 weights, widened: whole in the working copy below stage 3, else gathered.
    std::vector<bf16> w(store_.total());
    if (zero_ < 3) {
      be.ToHost(w.data(), store_.working(), 2 * w.size());
    } else {
      // The shard from the tier where it lives there (host memory: a CPU run's).
      std::vector<bf16> shard;
      if (store_.offloaded(optim::ParamStore::Kind::kWorking)) {
        shard.resize(store_.state_hi() - store_.state_lo());
        store_.ReadState(optim::ParamStore::Kind::kWorking, 0, shard.size(), shard.data());
      }
      Buffer gathered(be, 2 * w.size());
      auto op = comm_.AllGatherAsync(shard.empty() ? store_.working() : shard.data(),
                                     gathered.data(), Counts(0, store_.total()), DType::kBF16);
      Wait(*op, "weight all-gather");
      be.ToHost(w.data(), gathered.data(), 2 * w.size());
    }
    ConvertBf16ToF32(full.data(), w.data(), w.size());
    return full;
  }
  using Kind = optim::ParamStore::Kind;
  if (zero_ == 0) {
    store_.VisitState(Kind::kMaster, false,
                      [&](void* p, size_t lo, size_t n) { be.ToHost(full.data() + lo, p, 4 * n); });
    return full;
  }
  // An offload tier's shard comes into memory to be sent: the host's, then a GPU's for NCCL.
  std::vector<float> shard(store_.offloaded(Kind::kMaster) ? store_.state_hi() - store_.state_lo()
                                                           : 0);
  if (!shard.empty()) store_.ReadState(Kind::kMaster, 0, shard.size(), shard.data());
  Buffer shard_dev(be, be.host_visible() ? 0 : 4 * shard.size());
  if (shard_dev.data()) be.FromHost(shard_dev.data(), shard.data(), shard_dev.bytes());
  const float* send = shard.empty()      ? store_.master()
                      : shard_dev.data() ? shard_dev.as<float>()
                                         : shard.data();
  // The group's communicator reads and writes the backend's memory (NCCL: the GPU's).
  Buffer gathered(be, be.host_visible() ? 0 : 4 * full.size());
  float* dst = be.host_visible() ? full.data() : gathered.as<float>();
  auto w = comm_.AllGatherAsync(send, dst, Counts(0, store_.total()), DType::kF32);
  Wait(*w, "master all-gather");
  if (!be.host_visible()) be.ToHost(full.data(), dst, 4 * full.size());
  return full;
}

}  // namespace keel::train
