#include "keel/train/run_data.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "keel/core/error.h"
#include "keel/data/dataset_meta.h"

namespace keel::train {
namespace {

// A blend's sources and the validation split must be token ids of one tokenizer: ids of two that
// fit the model's vocabulary would train (or score) as one language silently. Named tokenizers
// are compared by name; a tokenizer.json (named by its path) by its size and end-of-document id.
void CheckOneTokenizer(const std::vector<std::pair<std::string, const data::TokenDataset*>>& all) {
  auto describe = [](const data::TokenDataset& d) {
    return data::TokenizerSpec(d.meta()) + " (" + std::to_string(d.vocab_size()) + " ids, eos " +
           std::to_string(d.eos_id()) + ")";
  };
  const auto& [first_what, first] = all.front();
  for (const auto& [what, d] : all) {
    auto json_file = [](const data::TokenDataset* x) {  // named by its path, not its name
      return x->meta() && x->meta()->tokenizer.rfind("hf:", 0) == 0;
    };
    const bool named = !json_file(d) && !json_file(first);
    const bool same =
        d->vocab_size() == first->vocab_size() && d->eos_id() == first->eos_id() &&
        (!named || data::TokenizerSpec(d->meta()) == data::TokenizerSpec(first->meta()));
    if (!same)
      ThrowBadInput(what + " " + d->path() + " was prepared with the tokenizer " + describe(*d) +
                    ", " + first_what + " " + first->path() + " with " + describe(*first) +
                    ": a run's datasets must share one tokenizer");
  }
}

}  // namespace

RunData OpenData(const RunConfig& cfg, const model::ModelConfig& mcfg, int dp_rank, int dp,
                 int micro_batch) {
  const int T = cfg.data.seq_len;
  RunData d;
  // `train = "path"` is a blend of one source with weight 1; it keeps the plain loader below, so
  // that its sample order (and every pinned loss) is exactly what it was before blending.
  d.sources = cfg.data.sources;
  if (d.sources.empty()) d.sources.push_back({cfg.data.train, 1.0});
  d.train_ds.reserve(d.sources.size());  // the loader keeps pointers into it
  for (const DataSource& src : d.sources) {
    d.train_ds.push_back(data::TokenDataset::Open(src.path));
    d.train_ds.back().CheckIds(mcfg.vocab_size);
    d.train_ptrs.push_back(&d.train_ds.back());
    d.weights.push_back(src.weight);
  }
  if (!cfg.data.val.empty()) {
    d.val_ds = std::make_unique<data::TokenDataset>(data::TokenDataset::Open(cfg.data.val));
    d.val_ds->CheckIds(mcfg.vocab_size);
  }
  std::vector<std::pair<std::string, const data::TokenDataset*>> all;
  for (const data::TokenDataset& ds : d.train_ds)
    all.push_back({cfg.data.sources.empty() ? "[data] train" : "[[data.sources]]", &ds});
  if (d.val_ds) all.push_back({"[data] val", d.val_ds.get()});
  CheckOneTokenizer(all);
  d.loader =
      d.train_ds.size() == 1
          ? std::make_unique<data::BatchLoader>(d.train_ds[0], T, cfg.train.batch_size, dp_rank, dp,
                                                cfg.train.seed,
                                                /*shuffle=*/true)
          : std::make_unique<data::BatchLoader>(d.train_ptrs, d.weights, T, cfg.train.batch_size,
                                                dp_rank, dp, cfg.train.seed);
  // The first val_batches × batch_size windows of the split (all of it for 0), in micro-batches:
  // `keel eval --max-tokens (that × seq_len) --batch (micro-batch)` prints the same number.
  if (d.val_ds)
    d.val_plan = PlanEval(*d.val_ds, T, micro_batch,
                          size_t(cfg.train.val_batches) * size_t(cfg.train.batch_size),
                          "[data] val " + cfg.data.val);
  return d;
}

double RunData::UnigramEntropy() const {
  const std::vector<const data::TokenDataset*>& sources = train_ptrs;
  size_t vocab = 0;
  for (const auto* ds : sources) vocab = std::max<size_t>(vocab, ds->vocab_size());
  double total_weight = 0;
  for (double w : weights) total_weight += w;
  std::vector<double> p(vocab, 0.0);
  std::vector<int32_t> chunk(1 << 16);
  std::vector<uint8_t> mask(chunk.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    const data::TokenDataset& ds = *sources[s];
    const size_t n = std::min<size_t>(ds.size(), 20'000'000);
    std::vector<uint64_t> counts(vocab, 0);
    uint64_t counted = 0;  // a loss mask's trained tokens only: what the loss is the mean over
    for (size_t i = 0; i < n; i += chunk.size()) {
      size_t m = std::min(chunk.size(), n - i);
      ds.Read(i, m, chunk.data());
      ds.ReadMask(i, m, mask.data());
      for (size_t j = 0; j < m; ++j)
        if (mask[j]) {
          counts[size_t(chunk[j])]++;
          ++counted;
        }
    }
    const double share = weights[s] / total_weight;
    for (size_t v = 0; v < vocab; ++v)
      if (counts[v]) p[v] += share * (double(counts[v]) / double(counted));
  }
  double h = 0;
  for (double q : p)
    if (q > 0) h -= q * std::log(q);
  return h;
}

}  // namespace keel::train
