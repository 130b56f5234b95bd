// The rows a dataset is cut into for training: windows of T + 1 tokens, whose first T are a row's
// inputs and whose last T are its next-token targets.
//
// A plain dataset is one stream: window i is tokens [i·T, i·T + T + 1), and documents run into
// one another across their eos token, as in GPT-2's and llm.c's pre-training.
//
// A loss-masked dataset (chat, prompt-completion: dataset_meta.h) is packed by document, so that
// no row starts in the middle of a conversation: each window starts at a document's start and
// holds the whole documents that fit after it, in order; a document longer than T + 1 tokens is
// truncated to its first T + 1 (the rest is dropped); what is left of a window is padding (eos).
// Targets the mask excludes, and padding, are -1: "no loss at this row" to the classifier.
// The trainer masks attention per document for such rows (model::Transformer::SetDocumentMask),
// so that a packed conversation never reads the one before it.
//
//   SampleWindows w(ds, /*T=*/256);
//   int scored = w.Read(i, tokens, targets);   // (T) each; targets trained on
#pragma once

#include <cstdint>
#include <vector>

#include "keel/data/dataset.h"

namespace keel::data {

class SampleWindows {
 public:
  // Throws keel::Error (bad input) naming the dataset when it has no window: too few tokens for
  // T + 1, or a masked dataset without a document.
  SampleWindows(const TokenDataset& ds, int T);

  uint64_t count() const { return count_; }
  bool masked() const { return ds_->masked(); }
  const TokenDataset& dataset() const { return *ds_; }

  // Window i's inputs and targets, T each; returns how many targets are trained on (not -1).
  // Uses scratch memory of its own: one caller at a time.
  int Read(uint64_t i, int32_t* tokens, int32_t* targets);
  // How many of window i's targets are trained on, from its loss mask alone (T when unmasked).
  int Scored(uint64_t i);

 private:
  // Window i's first token and length (<= T + 1; the rest is padding).
  void Span(uint64_t i, uint64_t* start, int* len) const;

  const TokenDataset* ds_;
  int T_;
  uint64_t count_ = 0;
  // Masked datasets: window i is tokens [starts_[i], starts_[i] + lens_[i]).
  std::vector<uint64_t> starts_;
  std::vector<int> lens_;
  std::vector<int32_t> window_;
  std::vector<uint8_t> mask_;
};

}  // namespace keel::data
