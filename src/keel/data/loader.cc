#include "keel/data/loader.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "keel/core/error.h"
#include "keel/core/rng.h"
#include "keel/data/dataset_meta.h"

namespace keel::data {

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t round)
    : n_(n), seed_(seed), round_(round) {
  int bits = 1;
  while ((uint64_t(1) << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
}

uint64_t Permutation::operator()(uint64_t i) const {
  const uint64_t mask = (uint64_t(1) << half_bits_) - 1;
  const Philox rng(seed_, round_);
  // Cycle walking: a Feistel network permutes [0, 4^half_bits); re-apply until inside [0, n).
  // Each application is a bijection, so the walk ends and the result is a bijection of [0, n).
  uint64_t x = i;
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      uint64_t f = rng.Bits((uint64_t(r) << 40) ^ right)[0] & mask;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

BatchLoader::BatchLoader(const TokenDataset& ds, int T, int global_batch, int rank, int world,
                         uint64_t seed, bool shuffle)
    : ds_(&ds),
      T_(T),
      global_batch_(global_batch),
      rank_(rank),
      world_(world),
      seed_(seed),
      shuffle_(shuffle) {
  windows_ = std::make_unique<SampleWindows>(ds, T);
  n_samples_ = windows_->count();
}

BatchLoader::BatchLoader(std::vector<const TokenDataset*> sources,
                         const std::vector<double>& weights, int T, int global_batch, int rank,
                         int world, uint64_t seed)
    : ds_(sources.empty() ? nullptr : sources[0]),
      sources_(sources),
      weights_(weights),
      T_(T),
      global_batch_(global_batch),
      rank_(rank),
      world_(world),
      seed_(seed),
      shuffle_(true) {
  blend_ = std::make_unique<BlendedSamples>(std::move(sources), weights, T, seed);
  n_samples_ = blend_->samples_in_source(0);
}

void BatchLoader::Fill(int64_t step, int micro, int micro_batch, int32_t* tokens,
                       int32_t* targets) {
  FillGlobal(uint64_t(step) * global_batch_ + uint64_t(rank_) * local_batch() +
                 uint64_t(micro) * micro_batch,
             micro_batch, tokens, targets);
}

void BatchLoader::Next(int micro_batch, int32_t* tokens, int32_t* targets) {
  if (micro_batch <= 0 || local_offset_ + micro_batch > local_batch())
    ThrowRuntime("BatchLoader::Next: micro_batch " + std::to_string(micro_batch) +
                 " does not fit the rest of the local batch (" + std::to_string(local_offset_) +
                 " of " + std::to_string(local_batch()) + " taken)");
  FillGlobal(position_ + uint64_t(rank_) * local_batch() + uint64_t(local_offset_), micro_batch,
             tokens, targets);
  local_offset_ += micro_batch;
  if (local_offset_ == local_batch()) {
    position_ += uint64_t(global_batch_);
    local_offset_ = 0;
  }
}

LoaderState BatchLoader::state() const {
  if (local_offset_ != 0)
    ThrowRuntime("BatchLoader::state: called mid-step (" + std::to_string(local_offset_) + " of " +
                 std::to_string(local_batch()) + " local samples taken); save at a step boundary");
  return Identity();
}

namespace {

// The sources' content as their meta.json records it: the shards' token, index and mask hashes in
// order, hashed. A flat file has none: its size stands in (the blend's other sources keep their
// protection); "" when no source has any.
std::string ContentHash(const std::vector<const TokenDataset*>& sources) {
  std::string all;
  bool any = false;
  for (const TokenDataset* ds : sources) {
    const DatasetMeta* meta = ds->meta();
    if (!meta) {
      all += "flat:" + std::to_string(ds->size()) + "|";
      continue;
    }
    any = true;
    for (const ShardMeta& s : meta->shards) all += s.xxh3 + s.index_xxh3 + s.mask_xxh3 + ";";
    all += "|";
  }
  if (!any) return "";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(all.data(), all.size())));
  return hex;
}

}  // namespace

LoaderState BatchLoader::Identity() const {
  LoaderState st{position_, seed_, T_, uint64_t(ds_->size()), {}, {}, {}};
  st.content_xxh3 = ContentHash(blend_ ? sources_ : std::vector<const TokenDataset*>{ds_});
  if (blend_) {
    st.dataset_tokens = 0;
    for (const TokenDataset* ds : sources_) {
      st.dataset_tokens += ds->size();
      st.source_tokens.push_back(ds->size());
    }
    st.weights = weights_;
  }
  return st;
}

void BatchLoader::restore(const LoaderState& st) {
  auto differs = [&](const char* field, const std::string& saved, const std::string& here) {
    ThrowBadInput("data " + ds_->path() + ": cannot restore the loader state: " + field +
                  " differs (saved " + saved + ", this run " + here + ")");
  };
  if (st.seed != seed_) differs("seed", std::to_string(st.seed), std::to_string(seed_));
  if (st.seq_len != T_) differs("seq_len", std::to_string(st.seq_len), std::to_string(T_));
  // Compared field by field, so the message names what changed (a weight, a source's size).
  const LoaderState here = Identity();
  auto list = [](const auto& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      std::ostringstream one;
      one << std::setprecision(17) << v[i];
      s += (i ? ", " : "") + one.str();
    }
    return s + "]";
  };
  if (st.weights.size() != here.weights.size())
    differs("sources", std::to_string(std::max<size_t>(st.weights.size(), 1)),
            std::to_string(std::max<size_t>(here.weights.size(), 1)));
  if (st.weights != here.weights) differs("weights", list(st.weights), list(here.weights));
  if (st.source_tokens != here.source_tokens)
    differs("source_tokens", list(st.source_tokens), list(here.source_tokens));
  if (st.dataset_tokens != here.dataset_tokens)
    differs("dataset_tokens", std::to_string(st.dataset_tokens),
            std::to_string(here.dataset_tokens));
  if (!st.content_xxh3.empty() && !here.content_xxh3.empty() &&
      st.content_xxh3 != here.content_xxh3)
    differs(
        "content_xxh3 (the shards' hashes in meta.json: prepared again with other tokens of the "
        "same count, or cut into other shards?)",
        st.content_xxh3, here.content_xxh3);
  position_ = st.position;
  local_offset_ = 0;
}

uint64_t BatchLoader::Sample(uint64_t g) const {
  const uint64_t epoch = g / n_samples_, pos = g % n_samples_;
  return shuffle_ ? Permutation(n_samples_, seed_, epoch)(pos) : pos;
}

void BatchLoader::FillGlobal(uint64_t first, int n, int32_t* tokens, int32_t* targets) {
  for (int b = 0; b < n; ++b) {
    const uint64_t g = first + uint64_t(b);
    int32_t* tok = tokens + size_t(b) * T_;
    int32_t* tgt = targets + size_t(b) * T_;
    if (blend_) {
      blend_->Read(g, tok, tgt);
    } else {
      windows_->Read(Sample(g), tok, tgt);
    }
  }
}

bool BatchLoader::masked() const { return blend_ ? blend_->masked() : windows_->masked(); }

uint64_t BatchLoader::StepScored() {
  if (local_offset_ != 0) ThrowRuntime("BatchLoader::StepScored: called mid-step");
  if (!masked()) return uint64_t(global_batch_) * uint64_t(T_);
  uint64_t n = 0;
  for (uint64_t g = position_; g < position_ + uint64_t(global_batch_); ++g)
    n += uint64_t(blend_ ? blend_->Scored(g) : windows_->Scored(Sample(g)));
  return n;
}

nlohmann::json ToJson(const LoaderState& st) {
  nlohmann::json j = {{"position", st.position},
                      {"seed", st.seed},
                      {"seq_len", st.seq_len},
                      {"dataset_tokens", st.dataset_tokens}};
  // Written only for a blend, so a single-dataset state is the same JSON as before blending.
  if (!st.weights.empty() || !st.source_tokens.empty()) {
    j["weights"] = st.weights;
    j["source_tokens"] = st.source_tokens;
  }
  if (!st.content_xxh3.empty()) j["content_xxh3"] = st.content_xxh3;
  return j;
}

LoaderState LoaderStateFromJson(const nlohmann::json& j) {
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(name))
      ThrowBadInput(std::string("loader state: missing field \"") + name + "\"");
    const auto& v = j.at(name);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      ThrowBadInput(std::string("loader state: field \"") + name +
                    "\" must be a non-negative integer, got " + v.dump());
    return v;
  };
  LoaderState st;
  st.position = field("position").get<uint64_t>();
  st.seed = field("seed").get<uint64_t>();
  st.seq_len = field("seq_len").get<int>();
  st.dataset_tokens = field("dataset_tokens").get<uint64_t>();
  // Optional: absent in single-dataset states (and in those saved before blending existed).
  if (j.contains("weights")) {
    const auto& w = j.at("weights");
    if (!w.is_array()) ThrowBadInput("loader state: field \"weights\" must be an array of numbers");
    for (const auto& x : w) {
      if (!x.is_number())
        ThrowBadInput("loader state: field \"weights\" must be an array of numbers, got " +
                      x.dump());
      st.weights.push_back(x.get<double>());
    }
  }
  if (j.contains("source_tokens")) {
    const auto& n = j.at("source_tokens");
    if (!n.is_array())
      ThrowBadInput("loader state: field \"source_tokens\" must be an array of integers");
    for (const auto& x : n) {
      if (!x.is_number_unsigned() && !(x.is_number_integer() && x.get<int64_t>() >= 0))
        ThrowBadInput(
            "loader state: field \"source_tokens\" must hold non-negative integers, got " +
            x.dump());
      st.source_tokens.push_back(x.get<uint64_t>());
    }
  }
  if (j.contains("content_xxh3")) {
    const auto& h = j.at("content_xxh3");
    if (!h.is_string() || h.get<std::string>().size() != 16 ||
        h.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      ThrowBadInput("loader state: field \"content_xxh3\" must be 16 lowercase hex digits, got " +
                    h.dump());
    st.content_xxh3 = h.get<std::string>();
  }
  return st;
}

}  // namespace keel::data
