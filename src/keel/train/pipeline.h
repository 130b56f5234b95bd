// The pipeline schedule: 1F1B (PipeDream-Flush, as in Megatron-LM). Stage s of p runs
// w = min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward, then
// drains the last w backwards, so it keeps at most min(p - s, m) micro-batches' activations
// (the model's slots). Activations travel to the next stage and their gradients back by
// asynchronous send/recv, posted as soon as the receiving slot is free so that transfers overlap
// compute. With one stage it is the plain loop: forward, backward, next micro-batch.
//
//   Pipeline pipe(model, pp_comm, timeout_s);      // pp_comm: this rank's stages, in order
//   double loss = pipe.Run(m, next, dloss, [&](int k) { zero.BeginMicroBatch(k == m - 1); });
//   pipe.bubble();   // the fraction of the schedule this stage sat waiting for a peer
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "keel/model/gpt.h"
#include "keel/parallel/comm.h"

namespace keel::train {

// Fills (micro_batch, seq_len) tokens and targets; returns the milliseconds it waited.
using NextBatch = std::function<double(int32_t* tokens, int32_t* targets)>;

class Pipeline {
 public:
  // `pp`: the ranks of this pipeline, stage = rank (null: one stage).
  Pipeline(model::GptModel& model, parallel::Comm* pp, int slots, double timeout_s);
  ~Pipeline();

  // One step's micro-batches through this stage. `before_backward(k)` runs before micro-batch
  // k's backward (the gradient strategy learns which is the last). Returns this stage's Σ row
  // losses (the last stage's; 0 elsewhere). `data_ms` receives the time spent in `next`.
  double Run(int m, const NextBatch& next, float dloss,
             const std::function<void(int)>& before_backward, double* data_ms);
  // Forward only, one micro-batch, no overlap (evaluation): Σ row losses on the last stage.
  double Forward(const int32_t* tokens, const int32_t* targets);

  // Of the last Run: milliseconds waiting for a peer's activations or gradients (and for sends
  // to drain), and that time as a fraction of the schedule (the measured bubble).
  double wait_ms() const { return wait_ms_; }
  double bubble() const { return bubble_; }
  double sent_bytes() const { return sent_bytes_; }

 private:
  void Wait(std::unique_ptr<parallel::Work>& w, const char* what);

  model::GptModel& model_;
  parallel::Comm* pp_;
  const int slots_, stage_, stages_;
  const double timeout_s_;
  const size_t bytes_;                                  // one boundary tensor
  std::vector<std::vector<int32_t>> tokens_, targets_;  // per slot
  std::vector<std::unique_ptr<parallel::Work>> act_recv_, act_send_, grad_recv_, grad_send_;
  double wait_ms_ = 0, bubble_ = 0, sent_bytes_ = 0;
};

}  // namespace keel::train
