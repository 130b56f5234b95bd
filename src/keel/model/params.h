// The parameter registry: every tensor of a model as a named view into one flat buffer.
//
// Order matters. Tensors are laid out wte, wpe (GPT-2), h.0.*, ..., h.{L-1}.*, ln_f (and Llama's
// lm_head), which is the reverse of the order in which backward finishes their gradients (except
// GPT-2's tied wte, finished last by the embedding backward): the gradients that are final at any
// moment of backward form one suffix [offset, end) of the flat buffer, so all-reduce buckets are
// plain slices. A Llama block is ln_1, attn.{q,k,v,o}_proj, ln_2, mlp.{gate,up,down}_proj: q, k, v
// and gate, up adjacent, so each group is one matrix product.
//
// Shapes are keel's [out, in]; GPT-2's export transposes to Hugging Face's Conv1D [in, out].
//
//   auto layout = keel::model::ParamLayout::Whole(cfg);
//   const auto& p = layout.Find("h.0.attn.c_attn.weight");   // p.offset, p.numel, p.shape
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/model/config.h"
#include "keel/parallel/state_bytes.h"

namespace keel::model {

struct ParamInfo {
  std::string name;
  std::vector<int> shape;
  size_t offset = 0;  // in elements, into the flat buffer
  size_t numel = 0;
  bool decay = false;  // weight decay applies (matrices and embeddings)
  float init_std = 0;  // 0: constant init (init_value)
  float init_value = 0;
  // A matrix product's bias: bf16 runs add it in fp32, so it is also kept as fp32 at this index
  // of the compact bias buffer (ParamLayout::n_bias() floats). SIZE_MAX for every other tensor.
  size_t bias_index = SIZE_MAX;
  // The tensor's index in the whole model's layout: its Philox stream at init, so that a pipeline
  // stage draws the same initial values as one process.
  size_t stream = 0;
  // A copy of a tensor another stage owns: the last stage's tied wte under pipeline parallelism.
  // It is updated like the original (its gradient is summed with the first stage's, so both stay
  // bit-identical) but neither written to checkpoints nor counted twice in the gradient norm.
  bool replica = false;
  // Tensor parallelism: the whole tensor's shape, and how this rank's shard (`shape`) is cut from
  // it: along axis `tp_axis` (-1: not cut; every tp rank holds it whole, and all but tp rank 0
  // hold it as a replica), which is a run of blocks, `tp_blocks` their extents along the axis
  // (empty: one block; c_attn's q, k, v: three; a Llama qkv adapter's q, k, v rows under grouped
  // query attention: three of two sizes), each cut in tp equal parts; tp rank r holds part r of
  // every block.
  std::vector<int> global_shape = {};
  int tp_axis = -1;
  std::vector<int> tp_blocks = {};
  // Where its gradient sits in the rank's gradient buffer (ParamLayout::grad_total() floats): the
  // offset itself, except in a LoRA layout, whose buffer holds the adapters' gradients packed
  // (then a scratch for the frozen norms'); SIZE_MAX: none (a frozen weight, not computed).
  size_t grad_offset = SIZE_MAX;
  // Where its working weights sit in the rank's working copy (ParamLayout::work_total() elements
  // of the working dtype): the offset itself, except in a layout with a quantized base, whose
  // working copy packs the tensors that are not quantized; SIZE_MAX for a quantized one.
  size_t work_offset = SIZE_MAX;
  // A quantized base's block matrix: its first element's index among the rank's quantized
  // elements (codes: quantize.h) and its first scale's index; SIZE_MAX otherwise.
  size_t quant_offset = SIZE_MAX, scale_offset = SIZE_MAX;
  bool quantized() const { return quant_offset != SIZE_MAX; }
};

// The tensor-parallel part of the model a rank holds: shard `rank` of `size`.
struct TpShard {
  int size = 1, rank = 0;
};

// For each contiguous run of the shard `p` of tp rank `tp_rank`: f(local, global, n), element
// offsets into the shard and into the whole tensor (row-major). One run for an uncut tensor.
template <typename F>
void ForEachShardRun(const ParamInfo& p, int tp_size, int tp_rank, F f) {
  if (p.tp_axis < 0 || tp_size == 1) return f(size_t(0), size_t(0), p.numel);
  size_t outer = 1, inner = 1;
  for (int a = 0; a < p.tp_axis; ++a) outer *= size_t(p.shape[size_t(a)]);
  for (size_t a = size_t(p.tp_axis) + 1; a < p.shape.size(); ++a) inner *= size_t(p.shape[a]);
  const size_t local = size_t(p.shape[size_t(p.tp_axis)]);
  const size_t global = size_t(p.global_shape[size_t(p.tp_axis)]);
  const std::vector<int> one = {int(global)};
  const std::vector<int>& blocks = p.tp_blocks.empty() ? one : p.tp_blocks;
  for (size_t o = 0; o < outer; ++o) {
    size_t l0 = 0, g0 = 0;  // the block's first index along the axis, in the shard and whole
    for (int block : blocks) {
      const size_t part = size_t(block) / size_t(tp_size);
      f((o * local + l0) * inner, (o * global + g0 + size_t(tp_rank) * part) * inner, part * inner);
      l0 += part;
      g0 += size_t(block);
    }
  }
}

// The part of the model a pipeline stage holds: blocks [l0, l1), the embeddings on the first
// stage, the final LayerNorm and the classifier (through the tied wte) on the last.
struct StageRange {
  int l0 = 0, l1 = 0, n_layer = 0;
  bool first() const { return l0 == 0; }
  bool last() const { return l1 == n_layer; }
  int layers() const { return l1 - l0; }
};
// Stage `stage` of `pp` equal stages (n_layer % pp == 0, checked by the config).
StageRange StageOf(const ModelConfig& cfg, int pp, int stage);
// Stage `stage` when stage i holds layers[i] blocks (Σ = n_layer).
StageRange StageOf(const ModelConfig& cfg, const std::vector<int>& layers, int stage);
// Blocks per stage that even out the stages' work: the last stage also runs the classifier
// (2·V·C FLOPs per token forward, about 5 GPT-2 124M blocks' worth), so it gets fewer blocks.
// Splits minimising the largest stage's forward FLOPs per token at sequence length T (each stage
// at least one block).
std::vector<int> BalancedStageLayers(const ModelConfig& cfg, int T, int pp);
inline StageRange WholeModel(const ModelConfig& cfg) { return {0, cfg.n_layer, cfg.n_layer}; }

class ParamLayout {
 public:
  static ParamLayout Whole(const ModelConfig& cfg, float init_std = 0.02f);
  // The tensors of one pipeline rank, in the same order, named as in the whole model: its
  // chunks' blocks (one stage, or v interleaved chunks in order), the embeddings if it holds the
  // first block, the final LayerNorm and a replica of the tied wte if it holds the last.
  // Under tensor parallelism (tp.size > 1) each tensor is this rank's shard (Megatron-LM's
  // cuts): c_attn and c_fc by output rows (heads split across ranks), the projections c_proj by
  // input columns, wte by vocabulary rows; LayerNorms, wpe and the projections' biases whole.
  static ParamLayout Stage(const ModelConfig& cfg, const std::vector<StageRange>& chunks,
                           TpShard tp = {});
  static ParamLayout Stage(const ModelConfig& cfg, const StageRange& stage, TpShard tp = {}) {
    return Stage(cfg, std::vector<StageRange>{stage}, tp);
  }

  const std::vector<ParamInfo>& params() const { return params_; }
  size_t total() const { return total_; }
  // Throws keel::Error if the name is unknown.
  const ParamInfo& Find(const std::string& name) const;
  const std::vector<StageRange>& chunks() const { return chunks_; }
  bool holds_first() const { return chunks_.front().first(); }
  bool holds_last() const { return chunks_.back().last(); }
  bool whole() const {
    return chunks_.size() == 1 && holds_first() && holds_last() && tp_.size == 1;
  }
  const TpShard& tp() const { return tp_; }
  // First element of layer l's tensors (h.l.*, l held here); layer_start(n_layer) is where ln_f
  // begins on the rank holding the last block.
  size_t layer_start(int l) const { return seg_start_[size_t(block_segment(l))]; }

  // Segments: the units in which weights are gathered and gradients reduced under ZeRO, in
  // layout order: the embeddings (wte, wpe; the last stage's wte replica), each block, the final
  // LayerNorm. For the whole model: 0 the embeddings, 1 + l block l, n_layer + 1 the final norm.
  int segments() const { return int(seg_start_.size()); }
  size_t segment_start(int s) const { return seg_start_[size_t(s)]; }
  size_t segment_end(int s) const {
    return s + 1 == segments() ? total_ : seg_start_[size_t(s) + 1];
  }
  size_t segment_size(int s) const { return segment_end(s) - segment_start(s); }
  // -1 where the stage has none.
  int embed_segment() const { return has_embed_ ? 0 : -1; }
  // Block l's segment (l one past the rank's last block: the segment after it); -1 if not held.
  int block_segment(int l) const;
  int final_segment() const { return holds_last() ? segments() - 1 : -1; }
  size_t n_bias() const { return n_bias_; }

  // The gradient buffer (ParamInfo::grad_offset). Whole models and stages without LoRA: the
  // layout itself (grad_total() = total()). With LoRA adapters: their gradients alone, packed in
  // layout order ([0, grad_trained())), then 2·C floats that take the frozen LayerNorms'
  // gradients, which the norm kernels compute beside the input gradient and nobody reads; the
  // other frozen weights get none. The data-parallel reduction and the norm cover
  // [0, grad_trained()).
  size_t grad_total() const { return grad_total_; }
  size_t grad_trained() const { return grad_trained_; }
  // Segment s's first gradient: the grad_offset of its first trained tensor (or of the next one).
  size_t segment_grad_start(int s) const { return seg_grad_start_[size_t(s)]; }

  // The working copy (ParamInfo::work_offset): the layout itself (work_total() = total()) unless
  // the base is quantized (ModelConfig::lora_base); then the tensors that are not, packed in layout
  // order, and the quantized block matrices apart: quant_elems() weights as codes
  // (quant_code_bytes() bytes) and quant_scales() fp32 scales, in layout order.
  BaseQuant base_quant() const { return quant_; }
  size_t work_total() const { return work_total_; }
  size_t segment_work_start(int s) const { return seg_work_start_[size_t(s)]; }
  size_t segment_work_end(int s) const {
    return s + 1 == segments() ? work_total_ : seg_work_start_[size_t(s) + 1];
  }
  // Segment s's first quantized element and first scale (its first quantized matrix's
  // quant_offset and scale_offset, or the next one's): a segment's codes and scales are
  // contiguous, [segment_quant_start(s), segment_quant_end(s)).
  size_t segment_quant_start(int s) const { return seg_quant_start_[size_t(s)]; }
  size_t segment_scale_start(int s) const { return seg_scale_start_[size_t(s)]; }
  size_t segment_quant_end(int s) const {
    return s + 1 == segments() ? quant_elems_ : seg_quant_start_[size_t(s) + 1];
  }
  size_t segment_scale_end(int s) const {
    return s + 1 == segments() ? quant_scales_ : seg_scale_start_[size_t(s) + 1];
  }
  size_t quant_elems() const { return quant_elems_; }
  size_t quant_scales() const { return quant_scales_; }
  size_t quant_code_bytes() const;

 private:
  void Add(std::string name, std::vector<int> shape, bool decay, float std, float value = 0);
  void Append(const ParamInfo& p);  // a tensor of the whole model, placed at the end
  void AssignBiases();
  void AssignGrads();
  void AssignWork(BaseQuant q);
  std::vector<ParamInfo> params_;
  // Find runs per layer per step (and per token in generation): a hash, not a scan of 150 names.
  std::unordered_map<std::string, size_t> index_;
  std::vector<size_t> seg_start_, seg_grad_start_, seg_work_start_, seg_quant_start_,
      seg_scale_start_;
  size_t grad_total_ = 0, grad_trained_ = 0;
  BaseQuant quant_ = BaseQuant::kNone;
  size_t work_total_ = 0, quant_elems_ = 0, quant_scales_ = 0;
  std::vector<StageRange> chunks_;
  TpShard tp_;
  bool has_embed_ = true;
  size_t total_ = 0;
  size_t n_bias_ = 0;
};

// LoRA (config.h): the (in, out) widths of the product target `t` adapts, in the whole model.
std::pair<int, int> LoraDims(const ModelConfig& cfg, LoraTarget t);
// An adapter tensor (h.L.MODULE.lora_A.weight, lora_B.weight or DoRA's lora_magnitude_vector).
bool IsLoraParam(const std::string& name);
// DoRA's magnitude of an adapted product (h.L.MODULE.lora_magnitude_vector), one of IsLoraParam's.
bool IsDoraMagnitude(const std::string& name);
// DoRA: every magnitude of `whole` (ParamLayout::Whole(cfg)'s values) set to the row norms of its
// base weight there, as a fresh adapter (B = 0) starts. Nothing without cfg.lora_dora.
void InitDoraMagnitudes(const ModelConfig& cfg, float* whole);
// DoRA: magnitude tensor `p` (this tp shard of it) as InitDoraMagnitudes sets it, from the base
// rows drawn again with `seed`: InitTensor's, for a run that draws its base a tensor at a time.
void InitDoraMagnitude(const ParamInfo& p, const ModelConfig& cfg, uint64_t seed, float* w,
                       TpShard tp);
// The same from base tensors `base` gives (q: a tensor of ParamLayout::Whole(cfg), whole, into
// q.numel floats): a run that reads its base from a file a tensor at a time.
void DoraMagnitudeFrom(const ParamInfo& p, const ModelConfig& cfg,
                       const std::function<void(const ParamInfo& q, float* out)>& base, float* w,
                       TpShard tp);
// DoRA's merge of W (out, in) = W₀ + s·B·A: each row scaled to magnitude[o] / its norm (fp64).
void DoraRescaleRows(float* W, const float* magnitude, int out, int in);
// The whole model's weights without adapters: each adapted product's weight plus s·B·A (DoRA:
// each row of that then scaled to its magnitude), in
// ParamLayout::Whole(BaseModel(cfg))'s order: what inference and exports use.
std::vector<float> MergeLora(const ModelConfig& cfg, const float* whole);
// The same in `whole` itself (the LoRA layout's values in, the base layout's out): what the end of
// a run and the checkpoint readers use, so that a 3B model's merge needs no second copy.
void MergeLoraInPlace(const ModelConfig& cfg, std::vector<float>& whole);
// W (out, in) += scale·B (out, r)·A (r, in), summed in fp64: the one merge of a LoRA update, for
// keel's adapters and PEFT's alike.
void AddLowRank(float* W, const float* B, const float* A, int out, int in, int r, double scale);

// Parameters that enter a matrix product for every token (the 6·N of a step's FLOPs): all but
// GPT-2's position table and Llama's input embedding, which are looked up. (GPT-2's wte is also
// its classifier, so it counts.)
size_t MatmulParams(const ModelConfig& cfg);

// The sizes parallel::StateBytesPerRank needs, from the layout (trainer and planner alike).
parallel::StateShape StateShapeOf(const ParamLayout& layout, DType dtype);
// The same for ParamLayout::Stage(cfg, chunks, tp) without building its tables: from the layouts
// of a model of the same widths with one and with two blocks in each chunk (every block holds the
// same tensors), so that it costs as little for 10⁸ layers as for 12. What the planner and the
// trainer's pre-allocation check size a rank with; equal to the built layout's.
parallel::StateShape StateShapeOf(const ModelConfig& cfg, const std::vector<StageRange>& chunks,
                                  TpShard tp, DType dtype);
// The chunks pipeline rank `stage` of `pp` holds, as train::TrainStep builds them: the whole model
// when pp == 1; stage_layers[stage] blocks when the stages are uneven (stage_layers not empty);
// else virtual stage c·pp + stage of pp·v equal ones, for c < v.
std::vector<StageRange> RankChunks(const ModelConfig& cfg, int pp, int stage, int v,
                                   const std::vector<int>& stage_layers = {});

// The axis along which tensor parallelism cuts the whole model's tensor `name` (-1: every tp
// rank holds it whole).
int TpAxis(const ModelConfig& cfg, const std::string& name);

// A LayerNorm's weight or bias: under sequence parallelism a tp rank's gradient of it covers its
// rows only, and the group sums them.
bool NormParam(const ParamInfo& p);

// Copies this rank's shards out of the whole model's flat values (ParamLayout::Gpt2's order) into
// `mine` (layout.total() floats), or back with `to_whole` (replicas skipped).
void CopyShards(const ParamLayout& layout, const ParamLayout& whole, const float* from, float* to,
                bool to_whole);

// Fills `out` (layout.total() floats) with the initial weights: a pure function of the seed, the
// tensor's index and the element's index (Philox), so every rank and thread count agrees.
// The padded vocabulary rows of wte start at zero.
void InitParams(const ParamLayout& layout, const ModelConfig& cfg, uint64_t seed, float* out);
// One tensor's (p.numel floats) of the same: a whole model's, a pipeline stage's or (with its
// rank's `tp`) a tensor-parallel shard, without the rest of the model.
void InitTensor(const ParamInfo& p, const ModelConfig& cfg, uint64_t seed, float* out,
                TpShard tp = {});

}  // namespace keel::model
