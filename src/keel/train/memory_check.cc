#include "keel/train/memory_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "keel/core/error.h"
#include "keel/model/activations.h"

namespace keel::train {
namespace {

// MemAvailable in bytes; a large figure when it cannot be read (no check rather than a false one).
double MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 1e30;
}

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

}  // namespace

std::vector<std::pair<std::string, double>> RunMemoryItems(const RunConfig& cfg,
                                                           const parallel::ParallelDims& d,
                                                           int micro_batch, int n_micro) {
  const model::ModelConfig m = cfg.ResolvedModel();
  const double C = m.n_embd, L = m.n_layer, V = m.padded_vocab(), T = cfg.data.seq_len;
  // GPT-2's parameter count (ParamLayout::Gpt2's tensors), without building the layout.
  const double params = V * C + double(m.block_size) * C + L * (12 * C * C + 13 * C) + 2 * C;
  const double per_rank = params / (d.tp * d.pp);
  const bool bf16 = cfg.train.precision != "fp32";
  const double dp = d.dp;
  const double working = (bf16 ? 2.0 : 0.0) * per_rank / (d.zero >= 3 ? dp : 1);
  const double grads = 4.0 * per_rank / (d.zero >= 2 ? dp : 1);
  const double master = 4.0 * per_rank / (d.zero >= 1 ? dp : 1);
  std::vector<std::pair<std::string, double>> items = {
      {"the weights, gradients and fp32 master copy of " + Count(params) +
           " parameters (model.n_layer " + std::to_string(m.n_layer) + ", n_embd " +
           std::to_string(m.n_embd) + ")",
       working + grads + master},
      {"the AdamW moments", 2 * master}};
  // The activation arena, as the trainer plans it (a first pipeline stage keeps up to pp slots).
  const int slots = d.pp > 1 ? std::min(d.pp, n_micro) : 1;
  const model::StageRange stage{0, std::max(1, m.n_layer / d.pp), m.n_layer};
  const double arena =
      double(model::PlanActivations(m, micro_batch, int(T), bf16 ? DType::kBF16 : DType::kF32,
                                    model::ParseRecompute(cfg.model.recompute), &stage, slots, d.tp,
                                    cfg.parallel.sp)
                 .total_bytes);
  items.push_back({"the activations of micro-batches of " + std::to_string(micro_batch) + " x " +
                       std::to_string(int(T)) + " tokens (train.micro_batch_size, data.seq_len)",
                   arena});
  items.push_back({"data.prefetch = " + std::to_string(cfg.data.prefetch) + " micro-batches ahead",
                   double(cfg.data.prefetch) * micro_batch * T * 8});
  // The fused classifier's tile: 512 rows of logits (and their bf16 gradients) over the shard.
  items.push_back({"the classifier's logit tile", 512.0 * (V / d.tp) * (bf16 ? 6 : 4)});
  std::sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.second > b.second; });
  return items;
}

void CheckMemoryFits(const RunConfig& cfg, const parallel::ParallelDims& dims, int micro_batch,
                     int n_micro, double available) {
  const auto items = RunMemoryItems(cfg, dims, micro_batch, n_micro);
  double total = 0;
  for (const auto& [what, bytes] : items) total += bytes;
  std::string where = "available";
  if (available < 0) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks = std::max(1, local ? std::atoi(local) : 1);
    available = MemAvailable() / ranks;
    where = ranks > 1 ? "available to each of the " + std::to_string(ranks) +
                            " ranks on this machine (MemAvailable / ranks)"
                      : "available on this machine (MemAvailable)";
  }
  if (total <= available) return;
  ThrowBadInput("this run needs " + GiB(total) + " per rank, " + GiB(available) + " is " + where +
                ": the largest items are " + items[0].first + " (" + GiB(items[0].second) +
                ") and " + items[1].first + " (" + GiB(items[1].second) +
                "); shrink them, or shard with [parallel] (keel plan sizes layouts)");
}

}  // namespace keel::train
