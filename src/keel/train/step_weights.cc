// TrainStep's weights in and out: the initial weights set into the store (whole, or a LoRA base
// a tensor at a time into its working form, ZeRO 3's packs among them), and the whole model's
// gathered back from every rank.
#include <algorithm>

#include "keel/core/error.h"
#include "keel/model/quantize.h"
#include "keel/model/segment_pack.h"
#include "keel/model/working_copy.h"
#include "keel/train/step.h"

namespace keel::train {

void TrainStep::SetWeights(const float* full) {
  // `full` is the whole model's layout; this rank's tensors (or shards) sit elsewhere in its own.
  // One process's layout is the whole one: no copy (a 1B model's would be 4 GB more at start).
  std::vector<float> copy;
  const float* mine = full;
  if (!layout_.whole()) {
    copy.resize(layout_.total());
    model::CopyShards(layout_, model::ParamLayout::Whole(spec_.model), full, copy.data(),
                      /*to_whole=*/false);
    mine = copy.data();
  }
  if (store_->compact())
    return SetWeights(
        [mine](const model::ParamInfo& p, std::vector<float>&) { return mine + p.offset; });
  const size_t n = store_->state_hi() - store_->state_lo();
  if (store_->has_master()) {
    store_->WriteState(optim::ParamStore::Kind::kMaster, 0, n, mine + store_->state_lo());
  } else {  // the bf16 weights are the only copy: rounded to nearest once, here
    std::vector<bf16> w(n);
    ConvertF32ToBf16(w.data(), mine + store_->state_lo(), n);
    store_->WriteState(optim::ParamStore::Kind::kMaster, 0, n, w.data());
  }
  zero_->PublishWeights();
  if (outer_) outer_->Start();
}

// A compact state keeps the frozen weights in the working copy only (a quantized base's matrices
// as codes and scales; bf16 runs: the fp32 biases too), and master weights for its trainable
// ranges, which are in layout order.
void TrainStep::SetWeights(const TensorValues& values) {
  KEEL_CHECK(store_->compact(), "TrainStep: a tensor at a time is for a compact state (LoRA)");
  const bool host = be_.host_visible();
  const model::BaseQuant q = layout_.base_quant();
  const size_t wb = DTypeSize(spec_.dtype);
  std::vector<float> scratch, packed, b(layout_.n_bias());
  std::vector<char> w;  // staging where the backend's memory is not the host's
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  // ZeRO 3: each segment's pack is built in host memory and this rank keeps its shard of it
  // (model/segment_pack.h), so that no rank ever holds the whole base.
  const bool in_packs = zero_->packed();
  const std::vector<model::SegmentPack>& packs = zero_->packs();
  const parallel::ShardRange own = zero_->packed_shard();
  std::vector<char> pack;
  int pack_seg = -1;
  auto keep_own = [&] {
    if (pack_seg < 0) return;
    const size_t a = packs[size_t(pack_seg)].start, b = a + pack.size();
    const size_t lo = std::max(a, 4 * own.lo), hi = std::min(b, 4 * own.hi);
    if (lo < hi)
      be_.FromHost(static_cast<char*>(store_->working()) + (lo - 4 * own.lo),
                   pack.data() + (lo - a), hi - lo);
  };
  auto next = store_->trainable().begin();
  for (const model::ParamInfo& p : layout_.params()) {
    const float* x = values(p, scratch);
    char* wd = nullptr;
    uint8_t* cd = nullptr;
    float* sd = nullptr;
    if (in_packs) {
      if (const int seg = model::SegmentOf(layout_, p); seg != pack_seg) {
        keep_own();
        pack_seg = seg;
        pack.assign(packs[size_t(seg)].bytes, 0);
      }
      const model::SegmentPack& sp = packs[size_t(pack_seg)];
      if (p.quantized()) {
        cd = reinterpret_cast<uint8_t*>(pack.data() + model::PackCodesAt(layout_, sp, pack_seg, p));
        sd = reinterpret_cast<float*>(pack.data() + model::PackScalesAt(layout_, sp, pack_seg, p));
      } else {
        wd = pack.data() + model::PackWorkAt(layout_, spec_.dtype, pack_seg, p);
      }
    } else if (p.quantized()) {
      cd = store_->codes() + model::CodeByte(q, p.quant_offset);
      sd = store_->scales() + p.scale_offset;
      codes.resize(host ? 0 : model::QuantCodeBytes(q, p.numel));
      scales.resize(host ? 0 : p.numel / model::QuantGroup(q, size_t(p.shape[1])));
    } else {
      wd = static_cast<char*>(store_->working()) + p.work_offset * wb;
      w.resize(host ? 0 : p.numel * wb);
    }
    // A shard cut by columns holds part of each int8 row: the row's scale is over every shard.
    std::vector<float> amax;
    if (p.quantized() && p.tp_axis == 1 && q == model::BaseQuant::kInt8 && g_.tp &&
        g_.tp->size() > 1) {
      const size_t rows = size_t(p.shape[0]), cols = size_t(p.shape[1]);
      amax.resize(rows);
      model::GroupAbsMax(q, x, rows, cols, amax.data());
      std::vector<double> wide(amax.begin(), amax.end());
      g_.tp->AllReduceMax(wide.data(), wide.size());
      std::copy(wide.begin(), wide.end(), amax.begin());
    }
    const bool direct = host || in_packs;  // written where it lives, or into the host's pack
    model::WriteTensor(q, spec_.dtype, p, x, direct ? wd : w.data(), direct ? cd : codes.data(),
                       direct ? sd : scales.data(), amax.empty() ? nullptr : amax.data());
    if (!direct && p.quantized()) {
      be_.FromHost(cd, codes.data(), codes.size());
      be_.FromHost(sd, scales.data(), 4 * scales.size());
    } else if (!direct) {
      be_.FromHost(wd, w.data(), w.size());
    }
    if (p.bias_index != SIZE_MAX && spec_.dtype != DType::kF32)
      // host: the staging of the bias copy, in host memory
      std::copy_n(x, p.numel, b.data() + p.bias_index);
    if (next != store_->trainable().end() && next->at == p.offset) {
      packed.insert(packed.end(), x, x + p.numel);
      ++next;
    }
  }
  keep_own();
  KEEL_CHECK(next == store_->trainable().end(), "TrainStep: a trainable range is no tensor");
  if (spec_.dtype != DType::kF32) be_.FromHost(store_->biases(), b.data(), 4 * b.size());
  be_.FromHost(store_->master(), packed.data() + store_->state_lo(),
               4 * (store_->state_hi() - store_->state_lo()));
  zero_->PublishWeights();
}

std::vector<float> TrainStep::GatherWeights() {
  std::vector<float> mine = zero_->GatherMaster();
  if (layout_.whole()) return mine;
  // Each stage and tp shard puts its values into the whole layout, zeros elsewhere; the sum over
  // the stages and shards is then every one's values exactly (x + 0 = x).
  const model::ParamLayout whole = model::ParamLayout::Whole(spec_.model);
  std::vector<float> full(whole.total(), 0.0f);
  model::CopyShards(layout_, whole, mine.data(), full.data(), /*to_whole=*/true);
  if (g_.pp && g_.pp->size() > 1) g_.pp->AllReduceSum(full.data(), full.size());
  if (g_.tp && g_.tp->size() > 1) g_.tp->AllReduceSum(full.data(), full.size());
  return full;
}

}  // namespace keel::train
