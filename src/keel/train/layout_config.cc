// The run's parallel layout from its config ([parallel], the batch in [train]): parallel::Layout
// with dp resolved and the micro-batches counted, checked by the layout's own rules, and in the
// config's words where only the config has the keys (pp_layers, batch_size).
#include <algorithm>
#include <sstream>

#include "keel/core/error.h"
#include "keel/model/params.h"
#include "keel/train/config.h"
#include "keel/train/config_schema.h"

namespace keel::train {
namespace {

// The global batch split over `dp` data-parallel replicas and micro-batches; `over` names the
// divisor in the message ("ranks" or "parallel.dp").
void CheckBatchSplit(const RunConfig& cfg, int dp, const std::string& over) {
  const internal::Provenance prov(cfg.source);
  const std::string where = prov.Where("train", "batch_size");
  const int batch = cfg.train.batch_size;
  const int micro = cfg.train.micro_batch_size;
  if (micro == 0) {
    if (batch % dp != 0)
      ThrowBadInput(where + ": " + std::to_string(batch) + " is not divisible by " + over + " (" +
                    std::to_string(dp) + ")");
    return;
  }
  // int64: ranks × micro can overflow int at large scale.
  const int64_t per_step = int64_t{dp} * micro;
  if (batch % per_step != 0)
    ThrowBadInput(where + ": " + std::to_string(batch) + " is not divisible by " + over + " (" +
                  std::to_string(dp) + ") × micro_batch_size (" + std::to_string(micro) + ")");
}

// Blocks per pipeline stage from [parallel] pp_layers (not empty): the FLOP-balanced split
// ("auto", model::BalancedStageLayers), or the list given ("9,3"), which must fit pp and the model.
std::vector<int> StageLayers(const RunConfig& cfg, const model::ModelConfig& m, int pp) {
  const ParallelSection& p = cfg.parallel;
  const std::string where = internal::Provenance(cfg.source).Where("parallel", "pp_layers");
  if (p.virtual_stages > 1)
    ThrowBadInput(where + ": uneven stages do not interleave; set parallel.virtual_stages=1");
  if (p.pp_layers == "auto") {
    if (pp > m.n_layer)
      ThrowBadInput(where + ": pp=" + std::to_string(pp) +
                    " stages need at least as many layers (" +
                    "model.n_layer=" + std::to_string(m.n_layer) + ")");
    return model::BalancedStageLayers(m, cfg.data.seq_len, pp);
  }
  std::vector<int> layers;
  int sum = 0;
  std::stringstream in(p.pp_layers);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    if (used != item.size() || item.empty() || n < 1)
      ThrowBadInput(where + ": \"" + p.pp_layers +
                    "\": expected \"auto\" or blocks per stage, e.g. \"9,3\" (each >= 1)");
    layers.push_back(n);
    sum += n;
  }
  if (int(layers.size()) != pp || sum != m.n_layer)
    ThrowBadInput(where + ": \"" + p.pp_layers + "\" gives " + std::to_string(layers.size()) +
                  " stage(s) of " + std::to_string(sum) + " layers in all; the run has pp=" +
                  std::to_string(pp) + " and model.n_layer=" + std::to_string(m.n_layer));
  return layers;
}

}  // namespace

parallel::Layout ResolveLayout(const RunConfig& cfg, int world) {
  const std::string prefix = internal::Provenance(cfg.source).File() + ": [parallel] ";
  auto s = [](long v) { return std::to_string(v); };
  if (world <= 0) ThrowBadInput(prefix + "cannot lay out " + s(world) + " ranks");
  const ParallelSection& p = cfg.parallel;
  if (p.dp < 0)
    ThrowBadInput(prefix + "dp=" + s(p.dp) +
                  ": expected an integer >= 1, or 0 for the ranks launched / (tp x pp x cp)");
  parallel::Layout l;
  l.dp = p.dp, l.tp = p.tp, l.pp = p.pp, l.zero = p.zero, l.cp = p.cp;
  // dp = 0: whatever tp x pp x cp leaves of the ranks. A remainder (6 ranks, tp=4) is not
  // rounded away: dp = 1 then fails ValidateRanks's "does not match the 6 ranks launched".
  if (l.dp == 0 && l.tp >= 1 && l.pp >= 1 && l.cp >= 1)
    l.dp = static_cast<int>(std::max<long>(1, world / (long(l.tp) * l.pp * l.cp)));
  l.sp = p.sp;
  l.cp_comm = p.cp_comm == "allgather" ? parallel::CpComm::kAllGather : parallel::CpComm::kRing;
  l.virtual_stages = p.virtual_stages;
  // The micro-batches, here only: train.micro_batch_size sequences (0: the rank's whole share of
  // train.batch_size), as many as the share holds. A dp < 1 fails ValidateRanks.
  const TrainSection& t = cfg.train;
  if (l.dp >= 1) {
    const int local = t.batch_size / l.dp;
    l.micro_batch = t.micro_batch_size > 0 ? t.micro_batch_size : local;
    l.n_micro = l.micro_batch > 0 ? local / l.micro_batch : 0;
  }

  const model::ModelConfig m = cfg.ResolvedModel();
  const parallel::LayoutInputs in{.world = world,
                                  .n_head = m.n_head,
                                  .n_layer = m.n_layer,
                                  .n_kv_head = m.kv_heads(),
                                  .ffn_hidden = m.ffn(),
                                  .padded_vocab = m.padded_vocab(),
                                  .global_batch = t.batch_size,
                                  .seq_len = cfg.data.seq_len};
  // Layout::Validate's steps, with its stage-list and batch rules in the config's words: the
  // pp_layers text as written, and where batch_size was set.
  const bool uneven = !p.pp_layers.empty();
  parallel::LayoutInputs ranks = in;
  if (uneven) ranks.n_layer = 0;  // the stages need not be equal: StageLayers checks the list
  l.ValidateRanks(ranks, prefix);
  if (uneven) l.stage_layers = StageLayers(cfg, m, l.pp);
  const bool derived = p.dp == 0;
  CheckBatchSplit(cfg, l.dp,
                  !derived                  ? "parallel.dp"
                  : l.tp * l.pp * l.cp == 1 ? "ranks"
                                            : "data-parallel ranks");
  l.ValidateSchedule(in, prefix);
  return l;
}

}  // namespace keel::train
