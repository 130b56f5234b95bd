#include "keel/train/memory_check.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "keel/ckpt/hf_gpt2.h"
#include "keel/ckpt/hf_llama.h"
#include "keel/core/error.h"
#include "keel/core/validate.h"
#include "keel/model/activations.h"
#include "keel/model/params.h"
#include "keel/model/segment_pack.h"
#include "keel/parallel/pipeline_schedule.h"
#include "keel/parallel/state_bytes.h"

namespace keel::train {
namespace {

std::string GiB(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", b / (1024.0 * 1024 * 1024));
  return s;
}

std::string Count(double n) {
  char s[32];
  std::snprintf(s, sizeof s, "%.4g", n);
  return s;
}

// keel's tensor shapes are ints: a width past INT_MAX (model.n_embd 10⁹ makes a 4·10⁹-wide MLP)
// has no layout to size, and no run; refused with the dimension.
void CheckShapesFit(const model::ModelConfig& m) {
  const long long C = m.n_embd, hs = m.n_embd / std::max(1, m.n_head);
  const long long ffn = m.ffn_hidden > 0 ? m.ffn_hidden : 4 * C;
  const long long kv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  const long long widest = std::max({3 * C, ffn * (m.llama() ? 2 : 1), (m.n_head + 2 * kv) * hs,
                                     (m.vocab_size + 127LL) / 128 * 128, (long long)m.block_size});
  if (widest <= INT_MAX) return;
  ThrowBadInput("model.n_layer " + std::to_string(m.n_layer) + ", n_embd " +
                std::to_string(m.n_embd) + ": the weights, gradients and fp32 master copy would " +
                "hold a tensor " + std::to_string(widest) + " wide, over keel's limit of " +
                std::to_string(INT_MAX) + "; shrink the model");
}

// One pipeline stage's rank: its state (every tensor-parallel rank holds the same sizes) and its
// chunks' activation arenas, as train::TrainStep allocates them.
struct StageBytes {
  parallel::StateBytes state;
  double arena = 0;
  double staging = 0;  // the checkpoint writer's (CheckpointStaging)
  double total() const { return double(state.total()) + arena + staging; }
};

// The checkpoint writer's staging buffer (ckpt/writer_snapshot.cc), allocated and touched at the
// start when the run saves at all: this rank's part of the master and both moments, widened to
// fp32 (the data-parallel ranks split the tensors), and its own tensors whole (DiLoCo's replica:
// its master, moments, outer momentum, int8 residual, streaming's sends and averages; int8
// gradient sums' residual). Four 124M DiLoCo replicas on one host were OOM-killed by 2.5 GB each
// of it that the check did not count.
double CheckpointStaging(const RunConfig& cfg, const parallel::StateShape& s,
                         const parallel::Layout& d) {
  const CheckpointSection& c = cfg.checkpoint;
  if (!(c.every_steps > 0 || c.every_minutes > 0 || c.at_end || c.on_signal || c.peer_every > 0))
    return 0;
  const size_t state = s.compact() ? s.trainable : s.total;
  const double part = double(parallel::Shard(state, d.replicas(), 0).size);
  const int staged = (s.master_offloaded() ? 0 : 1) + (s.offload_chunk > 0 ? 0 : 2);
  // Under DiLoCo GradResidualElems is the outer loop's residual, counted with its replica.
  double own = s.diloco ? 0 : double(parallel::GradResidualElems(s, d));
  if (s.diloco) {
    const bool residual = s.grad_comm == parallel::GradWire::kInt8 && d.replicas() > 1;
    own += double(state) * (4 + (residual ? 1 : 0) + (cfg.diloco.overlap_steps > 0 ? 2 : 0));
  }
  return 4.0 * (staged * part + own);
}

StageBytes BytesOfStage(const RunConfig& cfg, const model::ModelConfig& m,
                        const parallel::Layout& d, int stage) {
  const DType dt = cfg.train.precision != "fp32" ? DType::kBF16 : DType::kF32;
  const int v = d.pp > 1 ? d.virtual_stages : 1;
  const std::vector<model::StageRange> chunks =
      model::RankChunks(m, d.pp, stage, v, d.pp > 1 ? d.stage_layers : std::vector<int>{});
  StageBytes b;
  const parallel::StateShape shape =
      parallel::WithTiers(model::StateShapeOf(m, chunks, {d.tp, 0}, dt), TiersOf(cfg));
  b.state = parallel::StateBytesPerRank(shape, d);
  b.staging = CheckpointStaging(cfg, shape, d);
  // One slot without a pipeline (PipelineSlots would list every micro-batch's units first).
  const std::vector<int> slots =
      d.pp > 1 ? parallel::PipelineSlots(d.pp, stage, int(chunks.size()), d.n_micro)
               : std::vector<int>{1};
  for (size_t c = 0; c < chunks.size(); ++c)
    b.arena += double(model::PlanActivations(m, d.micro_batch, cfg.data.seq_len / d.cp, dt,
                                             model::ParseRecompute(cfg.model.recompute), &chunks[c],
                                             slots[c], d.tp, d.sp, d.cp, d.cp_comm)
                          .total_bytes);
  return b;
}

// The whole model's fp32 values (ParamLayout::Whole(m).total() floats).
double WholeFp32Bytes(const model::ModelConfig& m) {
  return 4.0 * double(model::StateShapeOf(m, {model::WholeModel(m)}, {}, DType::kF32).total);
}

// The start: the initial weights are whole in fp32 on every rank, whatever its layout, while its
// state is set from them (run_setup.cc): read from model.init_from, or drawn (a run that may
// resume draws them once it finds no checkpoint), unless a LoRA run draws its base a tensor at a
// time: then its largest tensor in fp32, and at ZeRO 3 the pack of a segment (segment_pack.h)
// that it builds before keeping its shard (TrainStep::SetWeights).
double InitialCopyBytes(const RunConfig& cfg, const model::ModelConfig& m, int zero) {
  if (!LoraBaseStreams(cfg)) return WholeFp32Bytes(m);
  // Every block holds the same tensors: a one-block model has the largest tensor and pack.
  model::ModelConfig one = m;
  one.n_layer = 1;
  const model::ParamLayout whole = model::ParamLayout::Whole(one);
  size_t largest = 0, pack = 0;
  for (const model::ParamInfo& p : whole.params()) largest = std::max(largest, p.numel);
  if (zero >= 3)
    for (const model::SegmentPack& sp :
         model::SegmentPacks(whole, cfg.train.precision == "fp32" ? DType::kF32 : DType::kBF16))
      pack = std::max(pack, sp.bytes);
  return 4.0 * double(largest) + double(pack);
}

}  // namespace

parallel::StateTiers TiersOf(const RunConfig& cfg) {
  parallel::StateTiers t;
  t.moment_bytes = cfg.optim.state_dtype == "bf16" ? 2 : 4;
  t.grad_bytes = cfg.optim.grad_dtype == "bf16" ? 2 : 4;
  t.master = cfg.optim.master_weights;
  if (!cfg.offload.dir.empty() || cfg.offload.host)
    t.offload_chunk = size_t(cfg.offload.chunk_mib * 1048576);
  t.offload_host = cfg.offload.host;
  t.offload_params = cfg.offload.params;
  t.grad_comm = parallel::ParseGradWire(cfg.parallel.grad_comm).value_or(parallel::GradWire::kF32);
  t.diloco = cfg.parallel.dp_sync == "diloco";
  t.diloco_streaming = t.diloco && (cfg.diloco.fragments > 1 || cfg.diloco.overlap_steps > 0);
  return t;
}

std::vector<std::pair<std::string, double>> RunMemoryItems(const RunConfig& cfg,
                                                           const parallel::Layout& d) {
  const int micro_batch = d.micro_batch;
  const model::ModelConfig m = cfg.ResolvedModel();
  CheckShapesFit(m);
  const bool bf16 = cfg.train.precision != "fp32";
  const double V = m.padded_vocab(), T = cfg.data.seq_len;
  // The busiest pipeline stage, by the formula its buffers are allocated with
  // (parallel::StateBytesPerRank over the stage's layout, `keel plan --accounting keel`'s).
  StageBytes b;
  for (int s = 0; s < d.pp; ++s) {
    const StageBytes x = BytesOfStage(cfg, m, d, s);
    if (s == 0 || x.total() > b.total()) b = x;
  }
  const double params = double(
      model::StateShapeOf(m, {model::WholeModel(m)}, {}, bf16 ? DType::kBF16 : DType::kF32).total);
  std::vector<std::pair<std::string, double>> items = {
      {std::string("the weights, gradients") + (b.state.master > 0 ? " and fp32 master copy" : "") +
           " of " + Count(params) + " parameters (model.n_layer " + std::to_string(m.n_layer) +
           ", n_embd " + std::to_string(m.n_embd) + ")",
       double(b.state.working + b.state.biases + b.state.quantized + b.state.grads +
              b.state.master)},
      {"the AdamW moments", double(b.state.moments)}};
  if (b.state.offload_buffers > 0)
    items.back() = {"the offload tier's three chunk buffers (offload.chunk_mib; the moments" +
                        std::string(bf16 && cfg.optim.master_weights ? " and fp32 master" : "") +
                        " are on disk in " + cfg.offload.dir + ")",
                    double(b.state.offload_buffers)};
  if (const double init = InitialCopyBytes(cfg, m, d.zero); init > 0)
    items.push_back({LoraBaseStreams(cfg)
                         ? "the largest tensor in fp32 while the base is set a tensor at a time"
                         : "the initial weights, whole in fp32 while the state is set from them",
                     init});
  if (b.staging > 0)
    items.push_back(
        {"the checkpoint's staging copy of this rank's part of the master and moments "
         "in fp32" +
             std::string(cfg.parallel.dp_sync == "diloco" ? " and of its DiLoCo replica's own state"
                                                          : "") +
             " (model.n_layer " + std::to_string(m.n_layer) + ", n_embd " +
             std::to_string(m.n_embd) + "; [checkpoint] saves set it)",
         b.staging});
  if (b.state.zero_buffers > 0)
    items.push_back({"ZeRO-" + std::to_string(d.zero) +
                         "'s per-segment buffers (gradient scratch, gathered weights)",
                     double(b.state.zero_buffers)});
  items.push_back({"the activations of micro-batches of " + std::to_string(micro_batch) + " x " +
                       std::to_string(int(T)) + " tokens (train.micro_batch_size, data.seq_len)",
                   b.arena});
  items.push_back({"data.prefetch = " + std::to_string(cfg.data.prefetch) + " micro-batches ahead",
                   double(cfg.data.prefetch) * micro_batch * T * 8});
  // The fused classifier's tile: 512 rows of logits (and their bf16 gradients) over the shard.
  items.push_back({"the classifier's logit tile", 512.0 * (V / d.tp) * (bf16 ? 6 : 4)});
  std::sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.second > b.second; });
  return items;
}

bool LoraBaseStreams(const RunConfig& cfg) {
  if (cfg.lora.rank <= 0 || !cfg.model.init_adapter.empty()) return false;
  const std::string& from = cfg.model.init_from;
  // A missing file takes the whole path, which says so.
  return from.empty() || ckpt::IsHfLlamaFolder(from) ||
         (std::filesystem::is_regular_file(from) && !ckpt::IsHfGpt2File(from));
}

void CheckMemoryFits(const RunConfig& cfg, const parallel::Layout& layout, double available) {
  const auto items = RunMemoryItems(cfg, layout);
  double total = 0;
  for (const auto& [what, bytes] : items) total += bytes;
  std::string where = "available";
  if (available < 0) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks = std::max(1, local ? std::atoi(local) : 1);
    const double mem = MemAvailableBytes();
    available = (mem > 0 ? mem : 1e30) / ranks;  // unreadable: no check rather than a false one
    where = ranks > 1 ? "available to each of the " + std::to_string(ranks) +
                            " ranks on this machine (MemAvailable / ranks)"
                      : "available on this machine (MemAvailable)";
  }
  if (total > available)
    ThrowBadInput("this run needs " + GiB(total) + " per rank, " + GiB(available) + " is " + where +
                  ": the largest items are " + items[0].first + " (" + GiB(items[0].second) +
                  ") and " + items[1].first + " (" + GiB(items[1].second) +
                  "); shrink them, or shard with [parallel] (keel plan sizes layouts)");
  // The end: the model file and the samples read the whole model in fp32, which every rank
  // gathers beside what it holds (TrainStep::GatherWeights), and the samples' model copies it
  // once more. A LoRA run over a large frozen base holds 1-2 bytes a weight while it trains and
  // needs 4-8 more there: refused now rather than killed after its last step. On a GPU the state
  // is the device's and the gather the host's.
  const bool samples = cfg.train.sample_count > 0 && !cfg.train.sample_prompt.empty();
  if (!cfg.checkpoint.save_final && !samples) return;
  const model::ModelConfig m = cfg.ResolvedModel();
  const double whole = (samples ? 2 : 1) * WholeFp32Bytes(m);
  // What the run holds then: its state and arenas, not the initial copy, which is gone.
  const double held = cfg.train.device == "cpu" ? total - InitialCopyBytes(cfg, m, layout.zero) : 0;
  if (held + whole <= available) return;
  ThrowBadInput("this run needs " + GiB(total) + " per rank while it trains and " + GiB(whole) +
                " more at its end, where each rank gathers the whole model in fp32 for "
                "checkpoint.save_final's model file and train.sample_count's samples; " +
                GiB(available) + " is " + where +
                ": set checkpoint.save_final = false and train.sample_count = 0 (the "
                "checkpoints hold the trained weights; a LoRA run's adapters export with keel "
                "ckpt export RUN --adapter), or shard with [parallel]");
}

}  // namespace keel::train
