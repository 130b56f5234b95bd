#include "keel/data/windows.h"

#include <algorithm>
#include <string>

#include "keel/core/error.h"

namespace keel::data {

SampleWindows::SampleWindows(const TokenDataset& ds, int T)
    : ds_(&ds), T_(T), window_(size_t(T) + 1), mask_(size_t(T) + 1) {
  if (T <= 0)
    ThrowBadInput("data " + ds.path() + ": seq_len " + std::to_string(T) + ": expected > 0");
  if (!ds.masked()) {
    count_ = ds.size() > 0 ? (ds.size() - 1) / uint64_t(T) : 0;
    if (count_ == 0)
      ThrowBadInput("data " + ds.path() + ": " + std::to_string(ds.size()) +
                    " tokens is too few for one sample of seq_len + 1 = " + std::to_string(T + 1));
    return;
  }
  // Greedy packing in document order: a pure function of the dataset and T, so every rank and
  // every resume cuts the same windows.
  const std::vector<uint64_t> bounds = ds.DocumentBounds();
  const uint64_t cap = uint64_t(T) + 1;
  uint64_t open = 0, used = 0;  // the window being filled: its start and tokens so far
  auto close = [&] {
    if (used == 0) return;
    starts_.push_back(open);
    lens_.push_back(int(used));
    used = 0;
  };
  for (size_t d = 0; d + 1 < bounds.size(); ++d) {
    const uint64_t len = bounds[d + 1] - bounds[d];
    if (len == 0) continue;
    if (used + len > cap) close();
    if (used == 0) open = bounds[d];
    used += std::min(len, cap);
    if (len >= cap) close();  // truncated: nothing more fits after it
  }
  close();
  count_ = starts_.size();
  if (count_ == 0) ThrowBadInput("data " + ds.path() + ": a loss-masked dataset with no document");
}

void SampleWindows::Span(uint64_t i, uint64_t* start, int* len) const {
  if (starts_.empty()) {
    *start = i * uint64_t(T_);
    *len = T_ + 1;
  } else {
    *start = starts_[i];
    *len = lens_[i];
  }
}

int SampleWindows::Read(uint64_t i, int32_t* tokens, int32_t* targets) {
  uint64_t start;
  int len;
  Span(i, &start, &len);
  ds_->Read(start, size_t(len), window_.data());
  std::copy(window_.begin(), window_.begin() + std::min(len, T_), tokens);
  std::fill(tokens + std::min(len, T_), tokens + T_, int32_t(ds_->eos_id()));
  std::copy(window_.begin() + 1, window_.begin() + len, targets);
  std::fill(targets + (len - 1), targets + T_, -1);
  if (!ds_->masked()) return T_;
  ds_->ReadMask(start + 1, size_t(len - 1), mask_.data());
  int scored = 0;
  for (int t = 0; t + 1 < len; ++t) {
    if (mask_[size_t(t)]) {
      ++scored;
    } else {
      targets[t] = -1;
    }
  }
  return scored;
}

int SampleWindows::Scored(uint64_t i) {
  if (!ds_->masked()) return T_;
  uint64_t start;
  int len;
  Span(i, &start, &len);
  ds_->ReadMask(start + 1, size_t(len - 1), mask_.data());
  return int(std::count(mask_.begin(), mask_.begin() + (len - 1), uint8_t(1)));
}

}  // namespace keel::data
