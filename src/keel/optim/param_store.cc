#include "keel/optim/param_store.h"

#include <algorithm>

#include "keel/core/error.h"

namespace keel::optim {
namespace {

// The ranges that overlap [lo, hi), cut to it and made relative to lo.
std::vector<ParamRange> Clip(const std::vector<ParamRange>& ranges, size_t lo, size_t hi) {
  std::vector<ParamRange> out;
  for (const ParamRange& r : ranges) {
    const size_t a = std::max(lo, r.offset), b = std::min(hi, r.offset + r.numel);
    if (a < b)
      out.push_back({a - lo, b - a, r.decay, r.frozen, r.replica,
                     r.at == SIZE_MAX ? SIZE_MAX : r.at + (a - r.offset),
                     r.work == SIZE_MAX ? SIZE_MAX : r.work + (a - r.offset), r.stream,
                     r.first + (a - r.offset)});
  }
  return out;
}

size_t HeldBy(const parallel::ShardRange& s, size_t total, bool sharded) {
  return sharded ? s.size : total;
}

// The shape says the moments' and gradients' dtypes (it sized them): the optimizer's follow.
AdamWHyper WithDtypes(AdamWHyper h, const parallel::StateShape& shape) {
  h.bf16_moments = shape.moment_bytes == 2;
  h.bf16_grads = shape.grad_bytes == 2;
  return h;
}

// The trainable ranges, packed: offset in the compact state, at in the layout.
std::vector<ParamRange> Packed(const std::vector<ParamRange>& ranges) {
  std::vector<ParamRange> out;
  size_t c = 0;
  for (const ParamRange& r : ranges) {
    if (r.frozen) continue;
    ParamRange p = r;
    p.offset = c;
    p.at = r.offset;
    out.push_back(p);
    c += r.numel;
  }
  return out;
}

}  // namespace

ParamStore::ParamStore(const parallel::StateShape& shape, const parallel::ParallelDims& dims,
                       int dp_rank, const std::vector<ParamRange>& ranges, const AdamWHyper& hyper,
                       const kernels::Backend& be, const std::string& offload_dir)
    : shape_(shape),
      be_(&be),
      dims_(dims),
      compact_(shape.compact()),
      trainable_(compact_ ? Packed(ranges) : ranges),
      shard_(parallel::Shard(state_total(), dims.replicas(), dp_rank)),
      state_lo_(dims.zero >= 1 ? shard_.lo : 0),
      state_hi_(dims.zero >= 1 ? shard_.hi : state_total()),
      grads_lo_(dims.zero >= 2 && !compact_ ? shard_.lo : 0),
      grads_size_(compact_ ? shape.grads : HeldBy(shard_, shape.total, dims.zero >= 2)),
      master_(Buffer::Zeroed(
          be, shape.master && !shape.master_offloaded() ? 4 * (state_hi_ - state_lo_) : 0)),
      grads_(Buffer::Zeroed(be, size_t(shape.grad_bytes) * grads_size_)),
      biases_(Buffer::Zeroed(be, shape.working_bytes == 2 ? 4 * shape.n_bias : 0)),
      // The host tier's update runs on the CPU, whatever the run's backend.
      opt_(Clip(compact_ ? trainable_ : ranges, state_lo_, state_hi_), state_hi_ - state_lo_,
           WithDtypes(hyper, shape), shape.offload_host ? kernels::Cpu() : be,
           /*own_moments=*/shape.offload_chunk == 0) {
  KEEL_CHECK(shape.master || (shape.working_bytes == 2 && !compact_),
             "ParamStore: weights without a master are a bf16 run's whole state (not LoRA's)");
  KEEL_CHECK(shape.grad_bytes == 4 || !compact_,
             "ParamStore: bf16 gradients are a full state's (LoRA's are the adapters' alone)");
  if (compact_) {
    KEEL_CHECK(dims.zero != 2, "ParamStore: a compact state shards at ZeRO 0, 1 and 3");
    size_t n = 0;
    for (const ParamRange& r : trainable_) n += r.numel;
    KEEL_CHECK(n == shape.trainable, "ParamStore: the shape's trainable count is not the ranges'");
  }
  const parallel::StateBytes b = parallel::StateBytesPerRank(shape, dims);
  working_ = Buffer::Zeroed(be, b.working);
  // At ZeRO 3 a compact state's working copy is its shard of the packed one, codes and scales
  // among them (model/segment_pack.h).
  if (shape.quantized && !(compact_ && dims.zero >= 3)) {
    KEEL_CHECK(compact_, "ParamStore: a quantized base is a compact state's (LoRA's)");
    codes_ = Buffer::Zeroed(be, shape.quantized - 4 * shape.quant_scales);
    scales_ = Buffer::Zeroed(be, 4 * shape.quant_scales);
  }
  working_lo_ = dims.zero >= 3 && !compact_ ? shard_.lo : 0;
  // A compact state's gradients are the trainable ones, packed as its master: nothing frozen.
  if (!compact_)
    for (const ParamRange& r : Clip(ranges, grads_lo_, grads_lo_ + grads_size_))
      if (r.frozen) frozen_.push_back(r);
  replicas_ = Clip(compact_ ? trainable_ : ranges, state_lo_, state_hi_);
  std::erase_if(replicas_, [](const ParamRange& r) { return !r.replica; });
  if (shape.offload_chunk > 0) {
    KEEL_CHECK(!compact_ && (shape.offload_host ? shape.working_bytes == 2 && !shape.fp16
                                                : be.host_visible()),
               "ParamStore: the offload tier holds a full state in host-visible memory (the "
               "host tier: a bf16 run's)");
    KEEL_CHECK(!shape.working_offloaded() || dims.zero >= 3,
               "ParamStore: the working weights go to the tier at ZeRO 3 only");
    const size_t n = state_hi_ - state_lo_;
    tier_ = std::make_unique<OffloadTier>(shape.offload_host ? "" : offload_dir, n,
                                          shape.tier_regions(),
                                          parallel::OffloadChunkElems(shape, n), be);
    if (shape.offload_host && b.offload_buffers) {
      stage_ = Buffer(HostMemory(), b.offload_buffers);
      be.PinHost(stage_.data(), stage_.bytes());
    }
    // Its fresh blocks read as zeros: the moments start at zero, as in memory.
  }
}

ParamStore::~ParamStore() {
  if (stage_.data()) be_->UnpinHost(stage_.data());
}

bool ParamStore::offloaded(Kind k) const {
  if (!tier_) return false;
  // Without a master the working weights stand for it, wherever they are.
  if (k == Kind::kMaster)
    return shape_.master ? shape_.master_offloaded() : shape_.working_offloaded();
  return k != Kind::kWorking || shape_.working_offloaded();
}

// The tier's regions: the master and the working weights where it holds them, then m and v.
int ParamStore::Region(Kind k) const {
  const int master = shape_.master_offloaded() ? 1 : 0;
  switch (k) {
    case Kind::kMaster:
      return shape_.master ? 0 : master;  // without one: the working weights' region
    case Kind::kWorking:
      return master;
    case Kind::kM:
    case Kind::kV:
      break;
  }
  return master + (shape_.working_offloaded() ? 1 : 0) + (k == Kind::kV ? 1 : 0);
}

char* ParamStore::Resident(Kind k) {
  switch (k) {
    case Kind::kMaster:
      return static_cast<char*>(master_data());
    case Kind::kWorking:
      return static_cast<char*>(working()) + DTypeSize(dtype()) * (state_lo_ - working_lo_);
    case Kind::kM:
      return static_cast<char*>(adam_m());
    case Kind::kV:
      break;
  }
  return static_cast<char*>(adam_v());
}

void ParamStore::ReadState(Kind k, size_t lo, size_t n, void* host) {
  if (offloaded(k)) return tier_->Read(Region(k), lo, n, host);
  const size_t eb = DTypeSize(state_dtype(k));
  be_->ToHost(host, Resident(k) + eb * lo, eb * n);
}

uint64_t ParamStore::ReadWorkingAsync(size_t lo, size_t n, void* host) {
  KEEL_CHECK(offloaded(Kind::kWorking), "ParamStore: the working weights are not on the tier");
  return tier_->ReadAsync(Region(Kind::kWorking), lo, n, host);
}

void ParamStore::WriteState(Kind k, size_t lo, size_t n, const void* host) {
  if (offloaded(k)) return tier_->Write(Region(k), lo, n, host);
  const size_t eb = DTypeSize(state_dtype(k));
  be_->FromHost(Resident(k) + eb * lo, host, eb * n);
}

void ParamStore::VisitState(Kind k, bool write,
                            const std::function<void(void* p, size_t lo, size_t n)>& fn) {
  const size_t n = state_hi_ - state_lo_, eb = DTypeSize(state_dtype(k));
  if (!offloaded(k)) return fn(Resident(k), 0, n);
  const size_t piece = std::min(n, (size_t(16) << 20) / eb);
  std::vector<uint8_t> host(piece * eb);
  // A GPU's (the host tier's): each piece goes through the device, where fn's operations run.
  Buffer dev(*be_, be_->host_visible() ? 0 : piece * eb);
  for (size_t lo = 0; lo < n; lo += piece) {
    const size_t k_n = std::min(piece, n - lo);
    ReadState(k, lo, k_n, host.data());
    if (dev.data()) be_->FromHost(dev.data(), host.data(), k_n * eb);
    fn(dev.data() ? dev.data() : host.data(), lo, k_n);
    if (!write) continue;
    if (dev.data()) be_->ToHost(host.data(), dev.data(), k_n * eb);
    WriteState(k, lo, k_n, host.data());
  }
}

void* ParamStore::master_data() {
  if (shape_.master || state_hi_ == state_lo_ || offloaded(Kind::kWorking)) return master_.data();
  return static_cast<bf16*>(working()) + (state_lo_ - working_lo_);
}

void* ParamStore::working() {
  if (offloaded(Kind::kWorking)) return nullptr;
  // fp32 at stages 0 and 3: the forward pass reads the master (all of it, or the shard).
  return working_.bytes() ? working_.data() : master_.data();
}

void ParamStore::ZeroFrozenGrads() {
  const size_t eb = size_t(shape_.grad_bytes);
  for (const ParamRange& r : frozen_)
    be_->Zero(static_cast<char*>(grads()) + eb * r.offset, eb * r.numel);
}

double ParamStore::LocalGradSquares() const {
  const size_t off = state_lo_ - grads_lo_;
  auto squares = [&](size_t at, size_t n) {
    if (shape_.grad_bytes == 2) return be_->SumSquares(grads_.as<bf16>() + off + at, n);
    return be_->SumSquares(grads_.as<float>() + off + at, n);
  };
  // The slice less the replicas (layout order, so sorted): each piece between them.
  double sq = 0;
  size_t at = 0;
  for (const ParamRange& r : replicas_) {
    sq += squares(at, r.offset - at);
    at = r.offset + r.numel;
  }
  return sq + squares(at, (state_hi_ - state_lo_) - at);
}

void ParamStore::Update(float lr, float grad_scale) {
  // The bf16 working copy receives the rounded update where it covers the state slice: all of it
  // (stage 0), this rank's place in the full copy (1, 2; then all-gathered), or the shard (3).
  // Without a master that slice is the weights' only copy, updated in place.
  const size_t gb = size_t(shape_.grad_bytes);
  if (compact_)
    return opt_.Step(master(), nullptr, static_cast<char*>(grads()) + gb * state_lo_, lr,
                     grad_scale);
  // AdamW rounds into a bf16 copy itself; an fp16 copy is rounded from the new master after.
  // The copy's slice in memory: none for fp32 (the master serves), or where the tier holds it.
  char* ws =
      dtype() != DType::kF32 && !offloaded(Kind::kWorking) ? Resident(Kind::kWorking) : nullptr;
  bf16* w = dtype() == DType::kBF16 ? reinterpret_cast<bf16*>(ws) : nullptr;
  const char* g = static_cast<char*>(grads()) + gb * (state_lo_ - grads_lo_);
  if (!tier_) {
    opt_.Step(master(), w, g, lr, grad_scale);
    if (dtype() == DType::kF16) be_->Narrow(DType::kF16, ws, master(), state_hi_ - state_lo_);
    return;
  }
  if (tier_->host()) return UpdateThroughHost(w, g, lr, grad_scale);
  // Chunk by chunk through the tier: the same elements, the same draws, the same bits.
  const bool on_tier = offloaded(Kind::kWorking);
  opt_.Begin();
  tier_->Stream([&](void* const* p, size_t lo, size_t n) {
    AdamW::Slice s = TierSlice(p, lo, n);
    if (!s.master && master()) s.master = master() + lo;
    // The chunk's 16-bit weights: the tier's region, or their place in memory.
    char* cw = on_tier ? static_cast<char*>(p[Region(Kind::kWorking)]) : ws ? ws + 2 * lo : nullptr;
    if (dtype() == DType::kBF16) s.working = reinterpret_cast<bf16*>(cw);
    s.grads = g + gb * lo;
    opt_.Apply(s, lr, grad_scale);
    if (dtype() == DType::kF16) be_->Narrow(DType::kF16, cw, s.master, n);
  });
}

void ParamStore::UpdateThroughHost(bf16* w, const char* g, float lr, float grad_scale) {
  const size_t gb = size_t(shape_.grad_bytes), chunk = tier_->chunk_elems(),
               n_all = state_hi_ - state_lo_;
  char* stage[2] = {stage_.as<char>(), stage_.as<char>() + gb * chunk};
  auto* w_host = reinterpret_cast<bf16*>(stage_.as<char>() + 2 * gb * chunk);
  // Chunk c's gradients land in stage[c % 2] on the copy stream while chunk c - 1 is updated.
  void* copies = nullptr;
  auto fetch = [&](size_t lo) {
    if (lo >= n_all) return;
    copies = be_->CopyStream();
    be_->ToHostAsync(stage[(lo / chunk) % 2], g + gb * lo, gb * std::min(chunk, n_all - lo),
                     copies);
  };
  fetch(0);
  opt_.Begin();
  tier_->Stream([&](void* const* p, size_t lo, size_t n) {
    be_->WaitCopies(copies);
    fetch(lo + n);
    AdamW::Slice s = TierSlice(p, lo, n);
    s.grads = stage[(lo / chunk) % 2];
    s.working = w_host;
    // Without a master the bf16 weights are what AdamW updates: read them first.
    if (!s.master) be_->ToHost(w_host, w + lo, 2 * n);
    opt_.Apply(s, lr, grad_scale);
    be_->FromHost(w + lo, w_host, 2 * n);
  });
}

AdamW::Slice ParamStore::TierSlice(void* const* p, size_t lo, size_t n) const {
  AdamW::Slice s;
  if (shape_.master_offloaded()) s.master = static_cast<float*>(p[Region(Kind::kMaster)]);
  s.m = p[Region(Kind::kM)];
  s.v = p[Region(Kind::kV)];
  s.lo = lo;
  s.n = n;
  return s;
}

parallel::StateBytes ParamStore::bytes() const {
  parallel::StateBytes b;
  b.working = working_.bytes();
  b.quantized = codes_.bytes() + scales_.bytes();
  b.biases = biases_.bytes();
  b.grads = grads_.bytes();
  b.master = master_.bytes();
  b.moments = tier_ ? 0 : 2 * DTypeSize(opt_.moment_dtype()) * (state_hi_ - state_lo_);
  if (tier_) {
    b.tier = tier_->file_bytes();
    b.offload_buffers = tier_->host()
                            ? stage_.bytes()
                            : parallel::OffloadBufferBytes(tier_->size(), tier_->chunk_elems(),
                                                           shape_.tier_bytes_per_elem());
  }
  return b;
}

}  // namespace keel::optim
