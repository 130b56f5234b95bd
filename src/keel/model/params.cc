#include "keel/model/params.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "keel/core/error.h"
#include "keel/core/rng.h"
#include "keel/model/quantize.h"
#include "keel/model/segment_pack.h"

namespace keel::model {

void ParamLayout::Add(std::string name, std::vector<int> shape, bool decay, float std,
                      float value) {
  size_t numel = 1;
  for (int d : shape) numel *= size_t(d);
  index_.emplace(name, params_.size());
  ParamInfo p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.global_shape = p.shape;
  p.offset = total_;
  p.numel = numel;
  p.decay = decay;
  p.init_std = std;
  p.init_value = value;
  p.stream = params_.size();
  params_.push_back(std::move(p));
  total_ += numel;
}

void ParamLayout::Append(const ParamInfo& p) {
  index_.emplace(p.name, params_.size());
  params_.push_back(p);
  params_.back().offset = total_;
  params_.back().bias_index = SIZE_MAX;
  total_ += p.numel;
}

// Matrix products' biases get an index in the compact fp32 bias buffer (ParamInfo::bias_index).
void ParamLayout::AssignBiases() {
  n_bias_ = 0;
  for (ParamInfo& info : params_) {
    const std::string& n = info.name;
    // DoRA's magnitudes too: a bf16 copy would scale a fresh adapter's rows by 1 ± 2⁻⁹.
    const bool matmul_bias = (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0 &&
                              n.find(".ln_") == std::string::npos && n.rfind("ln_f", 0) != 0) ||
                             IsDoraMagnitude(n);
    if (!matmul_bias) continue;
    info.bias_index = n_bias_;
    n_bias_ += info.numel;
  }
}

void ParamLayout::AssignGrads() {
  bool lora = false;
  for (const ParamInfo& info : params_) lora = lora || IsLoraParam(info.name);
  if (!lora) {
    for (ParamInfo& info : params_) info.grad_offset = info.offset;
    seg_grad_start_ = seg_start_;
    grad_total_ = grad_trained_ = total_;
    return;
  }
  size_t at = 0, norm = 0;
  for (ParamInfo& info : params_) {
    if (NormParam(info)) norm = std::max(norm, info.numel);
    if (!IsLoraParam(info.name)) continue;
    info.grad_offset = at;
    at += info.numel;
  }
  grad_trained_ = at;
  grad_total_ = at + 2 * norm;
  // A norm's weight and bias share one kernel call: each its own half of the scratch.
  for (ParamInfo& info : params_)
    if (NormParam(info)) info.grad_offset = at + (info.name.ends_with(".bias") ? norm : 0);
  // Each segment's first trained gradient: the packed count before the segment's first element.
  seg_grad_start_.assign(seg_start_.size(), 0);
  size_t before = 0;
  auto it = params_.begin();
  for (size_t s = 0; s < seg_start_.size(); ++s) {
    for (; it != params_.end() && it->offset < seg_start_[s]; ++it)
      if (IsLoraParam(it->name)) before += it->numel;
    seg_grad_start_[s] = before;
  }
}

void ParamLayout::AssignWork(BaseQuant q) {
  quant_ = q;
  work_total_ = quant_elems_ = quant_scales_ = 0;
  seg_work_start_.assign(seg_start_.size(), 0);
  seg_quant_start_.assign(seg_start_.size(), 0);
  seg_scale_start_.assign(seg_start_.size(), 0);
  size_t s = 0;
  auto open = [&](size_t seg) {
    seg_work_start_[seg] = work_total_;
    seg_quant_start_[seg] = quant_elems_;
    seg_scale_start_[seg] = quant_scales_;
  };
  for (ParamInfo& info : params_) {
    for (; s < seg_start_.size() && seg_start_[s] <= info.offset; ++s) open(s);
    info.work_offset = info.quant_offset = info.scale_offset = SIZE_MAX;
    if (QuantizedParam(q, info)) {
      info.quant_offset = quant_elems_;
      info.scale_offset = quant_scales_;
      quant_elems_ += info.numel;
      quant_scales_ += info.numel / QuantGroup(q, size_t(info.shape[1]));
    } else {
      info.work_offset = work_total_;
      work_total_ += info.numel;
    }
  }
  for (; s < seg_start_.size(); ++s) open(s);
}

size_t ParamLayout::quant_code_bytes() const { return QuantCodeBytes(quant_, quant_elems_); }

StageRange StageOf(const ModelConfig& cfg, int pp, int stage) {
  const int per = cfg.n_layer / pp;
  return {stage * per, (stage + 1) * per, cfg.n_layer};
}

StageRange StageOf(const ModelConfig& cfg, const std::vector<int>& layers, int stage) {
  int l0 = 0;
  for (int i = 0; i < stage; ++i) l0 += layers[size_t(i)];
  return {l0, l0 + layers[size_t(stage)], cfg.n_layer};
}

std::vector<int> BalancedStageLayers(const ModelConfig& cfg, int T, int pp) {
  // Forward FLOPs per token: a block's matrix products (GPT-2: 24·C²; a Llama's as sized) and
  // attention (4·T·C, causal halved: 2·T·C), the classifier 2·Vp·C on the last stage. Backward is
  // about twice each, alike.
  const double C = cfg.n_embd;
  const double block_params = C * cfg.qkv_dim() + C * C + C * (cfg.fc_dim() + cfg.ffn());
  const double block = 2 * block_params + 2.0 * T * C;
  const double head = 2.0 * cfg.padded_vocab() * C;
  const int L = cfg.n_layer;
  // best[k][l]: the least possible largest stage over the first k stages holding l blocks.
  const double inf = 1e300;
  std::vector<std::vector<double>> best(size_t(pp) + 1, std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(pp) + 1, std::vector<int>(size_t(L) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= pp; ++k)
    for (int l = k; l <= L; ++l)
      for (int n = 1; n <= l - (k - 1); ++n) {
        const double prev = best[size_t(k - 1)][size_t(l - n)];
        if (prev >= inf) continue;
        const double cost = std::max(prev, n * block + (k == pp ? head : 0.0));
        if (cost < best[size_t(k)][size_t(l)]) {
          best[size_t(k)][size_t(l)] = cost;
          cut[size_t(k)][size_t(l)] = n;
        }
      }
  std::vector<int> layers(static_cast<size_t>(pp));
  for (int k = pp, l = L; k >= 1; --k) {
    layers[size_t(k - 1)] = cut[size_t(k)][size_t(l)];
    l -= layers[size_t(k - 1)];
  }
  return layers;
}

ParamLayout ParamLayout::Whole(const ModelConfig& cfg, float init_std) {
  ParamLayout p;
  const int C = cfg.n_embd, L = cfg.n_layer;
  // GPT-2 scales the residual projections by 1/√(2L) so that the residual stream's variance does
  // not grow with depth; keel's Llamas do the same (as torchtitan and OLMo do).
  const float proj_std = init_std / std::sqrt(2.0f * L);
  p.chunks_ = {WholeModel(cfg)};
  p.seg_start_.push_back(0);
  p.Add("wte.weight", {cfg.padded_vocab(), C}, true, init_std);
  if (!cfg.llama()) p.Add("wpe.weight", {cfg.block_size, C}, true, init_std);
  const int hs = cfg.head_size(), q = cfg.n_head * hs, kv = cfg.kv_heads() * hs, F = cfg.ffn();
  // A block's adapters come after its own tensors, in its segment, so that ZeRO, pipeline stages
  // and checkpoints carry them as they carry the block.
  auto adapters = [&](const std::string& h) {
    for (LoraTarget t : kLoraTargets) {
      if (!(cfg.lora_targets & t) || cfg.lora_rank == 0) continue;
      const auto [in, out] = LoraDims(cfg, t);
      const std::string m = h + LoraModule(cfg.llama(), t);
      p.Add(m + ".lora_A.weight", {cfg.lora_rank, in}, true, init_std);
      p.Add(m + ".lora_B.weight", {out, cfg.lora_rank}, true, 0);
      // A scale, like a norm's weight: not decayed. Its value comes from the base (InitTensor).
      if (cfg.lora_dora) p.Add(m + ".lora_magnitude_vector", {out}, false, 0, 1.0f);
    }
  };
  for (int l = 0; l < L; ++l) {
    p.seg_start_.push_back(p.total_);
    const std::string h = "h." + std::to_string(l) + ".";
    if (cfg.llama()) {
      // q, k, v (and gate, up) are adjacent, so one product computes them together, and under
      // tensor parallelism a rank's shards of them are adjacent too.
      p.Add(h + "ln_1.weight", {C}, false, 0, 1.0f);
      p.Add(h + "attn.q_proj.weight", {q, C}, true, init_std);
      p.Add(h + "attn.k_proj.weight", {kv, C}, true, init_std);
      p.Add(h + "attn.v_proj.weight", {kv, C}, true, init_std);
      p.Add(h + "attn.o_proj.weight", {C, q}, true, proj_std);
      p.Add(h + "ln_2.weight", {C}, false, 0, 1.0f);
      p.Add(h + "mlp.gate_proj.weight", {F, C}, true, init_std);
      p.Add(h + "mlp.up_proj.weight", {F, C}, true, init_std);
      p.Add(h + "mlp.down_proj.weight", {C, F}, true, proj_std);
      adapters(h);
      continue;
    }
    p.Add(h + "ln_1.weight", {C}, false, 0, 1.0f);
    p.Add(h + "ln_1.bias", {C}, false, 0);
    p.Add(h + "attn.c_attn.weight", {3 * C, C}, true, init_std);
    p.Add(h + "attn.c_attn.bias", {3 * C}, false, 0);
    p.Add(h + "attn.c_proj.weight", {C, C}, true, proj_std);
    p.Add(h + "attn.c_proj.bias", {C}, false, 0);
    p.Add(h + "ln_2.weight", {C}, false, 0, 1.0f);
    p.Add(h + "ln_2.bias", {C}, false, 0);
    p.Add(h + "mlp.c_fc.weight", {4 * C, C}, true, init_std);
    p.Add(h + "mlp.c_fc.bias", {4 * C}, false, 0);
    p.Add(h + "mlp.c_proj.weight", {C, 4 * C}, true, proj_std);
    p.Add(h + "mlp.c_proj.bias", {C}, false, 0);
    adapters(h);
  }
  p.seg_start_.push_back(p.total_);
  p.Add("ln_f.weight", {C}, false, 0, 1.0f);
  if (cfg.llama())
    p.Add("lm_head.weight", {cfg.padded_vocab(), C}, true, init_std);
  else
    p.Add("ln_f.bias", {C}, false, 0);
  p.AssignBiases();
  p.AssignGrads();
  p.AssignWork(cfg.lora_base);
  return p;
}

namespace {

// How tensor parallelism cuts a tensor of the whole model: its axis (-1 for none) and blocks
// (ParamInfo::tp_blocks).
std::pair<int, std::vector<int>> TpCut(const ModelConfig& cfg, const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const int C = cfg.n_embd, q = cfg.n_head * cfg.head_size(), kv = cfg.kv_heads() * cfg.head_size();
  // An adapter is split the way its base matrix is: a column-parallel product's B (and DoRA's
  // magnitude) by its output rows in the base's blocks (A whole: its gradient is summed over the
  // group), a row-parallel one's A by its input columns (B and the magnitude whole: the partial
  // products and norms they meet are summed anyway).
  for (LoraTarget t : kLoraTargets) {
    const std::string m = LoraModule(cfg.llama(), t);
    const bool column = t == kLoraQkv || t == kLoraFc;
    if (ends(m + ".lora_A.weight")) return {column ? -1 : 1, {}};
    if (!ends(m + ".lora_B.weight") && !ends(m + ".lora_magnitude_vector")) continue;
    if (!column) return {-1, {}};
    if (t == kLoraFc)
      return {0, cfg.llama() ? std::vector{cfg.ffn(), cfg.ffn()} : std::vector<int>{}};
    return {0, cfg.llama() ? std::vector{q, kv, kv} : std::vector{C, C, C}};
  }
  if (name == "wte.weight" || name == "lm_head.weight") return {0, {}};
  // GPT-2's c_attn holds q, k and v (3 blocks); Llama's are separate tensors, cut alike.
  if (ends("attn.c_attn.weight") || ends("attn.c_attn.bias")) return {0, {C, C, C}};
  if (ends("mlp.c_fc.weight") || ends("mlp.c_fc.bias")) return {0, {}};
  if (ends("q_proj.weight") || ends("k_proj.weight") || ends("v_proj.weight")) return {0, {}};
  if (ends("gate_proj.weight") || ends("up_proj.weight")) return {0, {}};
  // The row-parallel products: by input columns.
  if (ends("c_proj.weight") || ends("o_proj.weight") || ends("down_proj.weight")) return {1, {}};
  return {-1, {}};
}

}  // namespace

int TpAxis(const ModelConfig& cfg, const std::string& name) { return TpCut(cfg, name).first; }

ParamLayout ParamLayout::Stage(const ModelConfig& cfg, const std::vector<StageRange>& chunks,
                               TpShard tp) {
  ParamLayout whole = Whole(cfg);
  if (chunks.size() == 1 && chunks[0].first() && chunks[0].last() && tp.size == 1) return whole;
  if (tp.size > 1) {
    KEEL_CHECK(cfg.n_head % tp.size == 0 && cfg.kv_heads() % tp.size == 0 &&
                   cfg.ffn() % tp.size == 0 && cfg.padded_vocab() % tp.size == 0,
               "Stage: tp must divide the heads, hidden units and padded vocabulary (config "
               "validation)");
    // Shard every tensor of the whole layout in place, then pick the stage's as usual.
    ParamLayout cut;
    for (ParamInfo info : whole.params_) {
      auto [axis, blocks] = TpCut(cfg, info.name);
      info.tp_axis = axis;
      info.tp_blocks = std::move(blocks);
      if (axis >= 0) {
        info.shape[size_t(axis)] /= tp.size;
        info.numel /= size_t(tp.size);
      } else if (tp.rank != 0) {
        info.replica = true;
      }
      cut.Append(info);
    }
    whole = std::move(cut);
  }
  ParamLayout p;
  p.tp_ = tp;
  p.chunks_ = chunks;
  // GPT-2's last stage holds a replica of the tied wte for its classifier; Llama's has lm_head.
  p.has_embed_ = p.holds_first() || (p.holds_last() && cfg.tied());
  if (p.has_embed_ && cfg.llama()) {
    p.seg_start_.push_back(0);
    p.Append(whole.Find("wte.weight"));
  } else if (p.has_embed_) {
    p.seg_start_.push_back(0);
    p.Append(whole.Find("wte.weight"));
    if (p.holds_first())
      p.Append(whole.Find("wpe.weight"));
    else
      p.params_.back().replica = true;
  }
  for (const StageRange& c : chunks)
    for (int l = c.l0; l < c.l1; ++l) {
      p.seg_start_.push_back(p.total_);
      const std::string h = "h." + std::to_string(l) + ".";
      for (const ParamInfo& info : whole.params())
        if (info.name.compare(0, h.size(), h) == 0) p.Append(info);
    }
  if (p.holds_last()) {
    p.seg_start_.push_back(p.total_);
    p.Append(whole.Find("ln_f.weight"));
    p.Append(whole.Find(cfg.llama() ? "lm_head.weight" : "ln_f.bias"));
  }
  p.AssignBiases();
  p.AssignGrads();
  p.AssignWork(cfg.lora_base);
  return p;
}

int ParamLayout::block_segment(int l) const {
  int s = has_embed_ ? 1 : 0;
  for (const StageRange& c : chunks_) {
    if (l >= c.l0 && l < c.l1) return s + l - c.l0;
    s += c.layers();
  }
  return l == chunks_.back().l1 ? s : -1;
}

const ParamInfo& ParamLayout::Find(const std::string& name) const {
  auto it = index_.find(name);
  if (it != index_.end()) return params_[it->second];
  ThrowRuntime("no parameter named \"" + name + "\"");
}

size_t MatmulParams(const ModelConfig& cfg) {
  const ParamLayout whole = ParamLayout::Whole(cfg);
  return whole.total() - whole.Find(cfg.llama() ? "wte.weight" : "wpe.weight").numel;
}

parallel::StateShape StateShapeOf(const ParamLayout& layout, DType dtype) {
  parallel::StateShape s;
  s.total = layout.total();
  s.n_bias = layout.n_bias();
  const int e = layout.embed_segment(), f = layout.final_segment();
  s.embed = e < 0 ? 0 : layout.segment_size(e);
  s.final_norm = f < 0 ? 0 : layout.segment_size(f);
  for (const StageRange& c : layout.chunks())
    for (int l = c.l0; l < c.l1; ++l)
      s.max_block = std::max(s.max_block, layout.segment_size(layout.block_segment(l)));
  s.working_bytes = dtype != DType::kF32 ? 2 : 4;
  s.fp16 = dtype == DType::kF16;
  // LoRA trains its adapters only, whose gradients the layout packs: the state is compact
  // (optim::ParamStore) when they are fewer than the weights.
  s.trainable = layout.grad_trained();
  s.grads = layout.grad_total();
  s.working = layout.work_total();
  s.quantized = layout.quant_code_bytes() + 4 * layout.quant_scales();
  s.quant_scales = layout.quant_scales();
  if (s.compact()) {
    const std::vector<SegmentPack> packs = SegmentPacks(layout, dtype);
    s.packed = PackedBytes(packs);
    size_t block = 0;
    for (const StageRange& c : layout.chunks())
      for (int l = c.l0; l < c.l1; ++l)
        block = std::max(block, packs[size_t(layout.block_segment(l))].bytes);
    s.packed_slots =
        (e < 0 ? 0 : packs[size_t(e)].bytes) + (f < 0 ? 0 : packs[size_t(f)].bytes) + 2 * block;
  }
  return s;
}

namespace {

// `chunks` with n blocks each, in a model just deep enough to keep which chunk holds the first
// block and which the last, and the gaps between them.
std::pair<ModelConfig, std::vector<StageRange>> Shrunk(const ModelConfig& cfg,
                                                       const std::vector<StageRange>& chunks,
                                                       int n) {
  std::vector<StageRange> out;
  int at = chunks.front().first() ? 0 : 1;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i > 0 && chunks[i].l0 > chunks[i - 1].l1) ++at;
    out.push_back({at, at + n, 0});
    at += n;
  }
  if (!chunks.back().last()) ++at;
  for (StageRange& c : out) c.n_layer = at;
  ModelConfig m = cfg;
  m.n_layer = at;
  return {m, out};
}

}  // namespace

parallel::StateShape StateShapeOf(const ModelConfig& cfg, const std::vector<StageRange>& chunks,
                                  TpShard tp, DType dtype) {
  KEEL_CHECK(!chunks.empty(), "StateShapeOf: no chunks");
  size_t blocks = 0;
  for (const StageRange& c : chunks) {
    KEEL_CHECK(c.layers() >= 1, "StateShapeOf: a chunk without blocks");
    blocks += size_t(c.layers());
  }
  const auto [m1, c1] = Shrunk(cfg, chunks, 1);
  const auto [m2, c2] = Shrunk(cfg, chunks, 2);
  parallel::StateShape s = StateShapeOf(ParamLayout::Stage(m1, c1, tp), dtype);
  const parallel::StateShape two = StateShapeOf(ParamLayout::Stage(m2, c2, tp), dtype);
  // Each chunk's second block added the same parameters and biases as every further one does.
  const size_t k = chunks.size();
  s.total += (blocks - k) * ((two.total - s.total) / k);
  s.n_bias += (blocks - k) * ((two.n_bias - s.n_bias) / k);
  s.trainable += (blocks - k) * ((two.trainable - s.trainable) / k);
  s.grads += (blocks - k) * ((two.grads - s.grads) / k);
  s.working += (blocks - k) * ((two.working - s.working) / k);
  s.quantized += (blocks - k) * ((two.quantized - s.quantized) / k);
  s.quant_scales += (blocks - k) * ((two.quant_scales - s.quant_scales) / k);
  s.packed += (blocks - k) * ((two.packed - s.packed) / k);  // the slots: one block's pack, alike
  return s;
}

std::vector<StageRange> RankChunks(const ModelConfig& cfg, int pp, int stage, int v,
                                   const std::vector<int>& stage_layers) {
  if (pp == 1) return {WholeModel(cfg)};
  if (!stage_layers.empty()) return {StageOf(cfg, stage_layers, stage)};
  std::vector<StageRange> chunks;
  for (int c = 0; c < v; ++c) chunks.push_back(StageOf(cfg, pp * v, c * pp + stage));
  return chunks;
}

bool NormParam(const ParamInfo& p) {
  return p.name.find("ln_") != std::string::npos;  // h.l.ln_1, h.l.ln_2, ln_f
}

void CopyShards(const ParamLayout& layout, const ParamLayout& whole, const float* from, float* to,
                bool to_whole) {
  const TpShard& tp = layout.tp();
  for (const ParamInfo& p : layout.params()) {
    if (to_whole && p.replica) continue;
    const size_t w = whole.Find(p.name).offset;
    ForEachShardRun(p, tp.size, tp.rank, [&](size_t local, size_t global, size_t n) {
      // host: host-memory copies of the weights (init, export, checkpoints), never the backend's
      if (to_whole)
        std::memcpy(to + w + global, from + p.offset + local, 4 * n);
      else  // host: as above
        std::memcpy(to + p.offset + local, from + w + global, 4 * n);
    });
  }
}

void InitParams(const ParamLayout& layout, const ModelConfig& cfg, uint64_t seed, float* out) {
  KEEL_CHECK(layout.tp().size == 1, "InitParams: the whole model's layout, then CopyShards");
  for (const ParamInfo& p : layout.params())
    if (!IsDoraMagnitude(p.name)) InitTensor(p, cfg, seed, out + p.offset);
  InitDoraMagnitudes(cfg, out);
}

void InitTensor(const ParamInfo& p, const ModelConfig& cfg, uint64_t seed, float* w, TpShard tp) {
  KEEL_CHECK(tp.size > 1 || p.global_shape == p.shape, "InitTensor: a shard needs its TpShard");
  if (IsDoraMagnitude(p.name)) return InitDoraMagnitude(p, cfg, seed, w, tp);
  if (p.init_std == 0) {
    for (size_t j = 0; j < p.numel; ++j) w[j] = p.init_value;
    return;
  }
  const Philox rng(seed, p.stream);
  // Padded vocabulary rows stay zero: they are masked out and must not drift.
  const bool vocab_rows = p.name == "wte.weight" || p.name == "lm_head.weight";
  const size_t live = vocab_rows ? size_t(cfg.vocab_size) * cfg.n_embd : SIZE_MAX;
  // Element j of the whole tensor is draw j of its stream: a shard draws its own elements only.
  std::vector<std::array<size_t, 3>> runs;  // (local, global, n)
  ForEachShardRun(p, tp.size, tp.rank, [&](size_t local, size_t global, size_t n) {
    runs.push_back({local, global, n});
  });
  auto draw = [&](const std::array<size_t, 3>& run, size_t i) {
    const size_t g = run[1] + i;
    w[run[0] + i] = g < live ? p.init_std * rng.Normal(g) : 0.0f;
  };
  // A few long runs (whole, or blocks of rows) split across threads; many short ones (a cut by
  // columns: one per row) a run per thread at a time.
  if (runs.size() <= 8) {
    for (const auto& run : runs) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < run[2]; ++i) draw(run, i);
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t i = 0; i < runs[r][2]; ++i) draw(runs[r], i);
}

}  // namespace keel::model
