// BlendSchedule (Megatron's greedy interleave, block-cached) and BlendedSamples (per-source
// reshuffled windows behind it). See blend.h.
#include "keel/data/blend.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "keel/core/error.h"
#include "keel/core/rng.h"
#include "keel/data/loader.h"

namespace keel::data {
namespace {

// __int128 is a GCC/Clang extension; __extension__ keeps -Wpedantic quiet about it.
__extension__ typedef __int128 Int128;

// Quantized weights sum to about this: W_i (g+1) < 2^48 · 2^64 fits in 127 bits.
constexpr double kWeightScale = 281474976710656.0;  // 2^48

std::string FormatWeight(double w) {
  std::ostringstream s;
  s.precision(17);
  s << w;
  return s.str();
}

}  // namespace

BlendSchedule::BlendSchedule(const std::vector<double>& weights) {
  if (weights.empty()) ThrowBadInput("data blend: no sources (expected at least one weight)");
  double sum = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double w = weights[i];
    if (!std::isfinite(w) || w <= 0)
      ThrowBadInput("data blend: source " + std::to_string(i) + " weight " + FormatWeight(w) +
                    ": expected a positive finite number");
    sum += w;
  }
  if (!std::isfinite(sum)) ThrowBadInput("data blend: the weights' sum overflows");
  for (double w : weights) {
    // A tiny but positive weight must stay positive: the user asked for some of that source.
    const double q = std::round(w / sum * kWeightScale);
    quantized_.push_back(q < 1 ? 1 : uint64_t(q));
    total_ += quantized_.back();
  }
  checkpoints_.push_back(std::vector<uint64_t>(weights.size(), 0));
  block_source_.resize(kBlock);
  block_index_.resize(kBlock);
}

double BlendSchedule::weight(int source) const {
  return double(quantized_[source]) / double(total_);
}

void BlendSchedule::DecodeBlock(uint64_t b) {
  std::vector<uint64_t> counts = checkpoints_[b];
  const int k = num_sources();
  for (uint64_t t = 0; t < kBlock; ++t) {
    const uint64_t next = b * kBlock + t + 1;  // g + 1
    // Deficit of source i: W_i (g+1) - c_i · total, i.e. (weight × (g+1) - c_i) · total.
    int best = 0;
    Int128 best_deficit = Int128(quantized_[0]) * next - Int128(counts[0]) * total_;
    for (int i = 1; i < k; ++i) {
      const Int128 d = Int128(quantized_[i]) * next - Int128(counts[i]) * total_;
      if (d > best_deficit) {  // strict: ties go to the lowest index
        best_deficit = d;
        best = i;
      }
    }
    block_source_[t] = uint32_t(best);
    block_index_[t] = counts[best]++;
  }
  cached_block_ = b;
  if (checkpoints_.size() == b + 1) checkpoints_.push_back(std::move(counts));
}

BlendSchedule::Location BlendSchedule::Locate(uint64_t g) {
  const uint64_t b = g / kBlock;
  if (b != cached_block_) {
    // Extend the checkpoints up to block b (each decode records the next block's start).
    while (checkpoints_.size() <= b) DecodeBlock(checkpoints_.size() - 1);
    if (b != cached_block_) DecodeBlock(b);
  }
  const uint64_t t = g % kBlock;
  return {int(block_source_[t]), block_index_[t]};
}

BlendedSamples::BlendedSamples(std::vector<const TokenDataset*> sources,
                               const std::vector<double>& weights, int T, uint64_t seed)
    : sources_(std::move(sources)), schedule_(weights), T_(T) {
  if (weights.size() != sources_.size())
    ThrowBadInput("data blend: " + std::to_string(sources_.size()) + " sources but " +
                  std::to_string(weights.size()) + " weights");
  if (T <= 0) ThrowBadInput("data blend: seq_len " + std::to_string(T) + ": expected > 0");
  // A stream of its own per source, so adding a source does not reshuffle the others.
  const Philox seeds(seed, /*stream=*/0x626c656e64);  // "blend"
  for (size_t i = 0; i < sources_.size(); ++i) {
    try {
      windows_.emplace_back(*sources_[i], T);
    } catch (const Error& e) {
      ThrowBadInput("data blend: source " + std::to_string(i) + ": " + e.what());
    }
    n_samples_.push_back(windows_.back().count());
    const auto bits = seeds.Bits(i);
    source_seeds_.push_back(uint64_t(bits[0]) << 32 | bits[1]);
  }
}

BlendedSamples::Window BlendedSamples::Resolve(uint64_t g) {
  const BlendSchedule::Location loc = schedule_.Locate(g);
  const uint64_t n = n_samples_[loc.source];
  const uint64_t epoch = loc.index / n, pos = loc.index % n;
  return {loc.source, Permutation(n, source_seeds_[loc.source], epoch)(pos)};
}

int BlendedSamples::Read(uint64_t g, int32_t* tokens, int32_t* targets) {
  const Window w = Resolve(g);
  return windows_[size_t(w.source)].Read(w.window, tokens, targets);
}

int BlendedSamples::Scored(uint64_t g) {
  const Window w = Resolve(g);
  return windows_[size_t(w.source)].Scored(w.window);
}

bool BlendedSamples::masked() const {
  return std::any_of(windows_.begin(), windows_.end(),
                     [](const SampleWindows& w) { return w.masked(); });
}

}  // namespace keel::data
