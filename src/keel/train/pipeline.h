// Runs a pipeline schedule (parallel/pipeline_schedule.h) on this rank: 1F1B over one stage, or
// interleaved 1F1B over v model chunks. Activations travel to the next virtual stage and their
// gradients back by asynchronous send/recv, each receive posted as soon as its slot is free, so
// that transfers overlap compute. With one stage it is the plain loop: forward, backward, next
// micro-batch.
//
//   Pipeline pipe({&chunk0, &chunk1}, pp_comm, timeout_s);   // pp_comm: the stages, in order
//   double loss = pipe.Run(m, next, dloss, [&](int k) { zero.BeginMicroBatch(k == m - 1); });
//   pipe.bubble();   // the fraction of the schedule this rank sat waiting for a peer
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "keel/model/transformer.h"
#include "keel/parallel/comm.h"

namespace keel::train {

// Fills (micro_batch, seq_len) tokens and targets; returns the milliseconds it waited.
using NextBatch = std::function<double(int32_t* tokens, int32_t* targets)>;

class Pipeline {
 public:
  // `chunks`: this rank's model chunks in layer order, each with the slots the schedule needs
  // (parallel::PipelineSlots); `pp`: the ranks of this pipeline, stage = rank (null: one stage).
  Pipeline(std::vector<model::Transformer*> chunks, parallel::Comm* pp, double timeout_s);
  ~Pipeline();

  // Waits, within one comm_timeout_s in all, for the transfers still in flight (they read and
  // write the models' arenas). False if one did not end: the arenas must then outlive this.
  bool Quiesce();

  // One step's micro-batches through this rank. `before_backward(k)` runs before each backward
  // of micro-batch k (the gradient strategy learns which is the last). Returns this rank's Σ row
  // losses (the last virtual stage's; 0 elsewhere). `data_ms` receives the time spent in `next`,
  // which every rank calls once per micro-batch, in order.
  double Run(int m, const NextBatch& next, float dloss,
             const std::function<void(int)>& before_backward, double* data_ms);
  // LoRA dropout in the next Run (model::Transformer::SetDropout): every micro-batch's mask
  // `key`, micro-batch k's first row `row0 + k·rows`. Off again after that Run.
  void SetDropout(uint64_t key, uint64_t row0, uint64_t rows) {
    dropout_ = {true, key, row0, rows};
  }
  // Forward only, one micro-batch, no overlap (evaluation): Σ row losses on the last stage.
  double Forward(const int32_t* tokens, const int32_t* targets);

  // Of the last Run: milliseconds waiting for a peer's activations or gradients (and for sends
  // to drain), and that time as a fraction of the schedule (the measured bubble).
  double wait_ms() const { return wait_ms_; }
  double bubble() const { return bubble_; }
  // Of the last Run: milliseconds in the chunks' forward passes, less the communication waits
  // the wait clock saw during them (a tensor-parallel all-reduce, a ZeRO 3 gather).
  double forward_ms() const { return forward_ms_; }
  // Cumulative milliseconds of communication waits within the step, read around each forward.
  void set_wait_clock(std::function<double()> clock) { wait_clock_ = std::move(clock); }
  double sent_bytes() const { return sent_bytes_; }

 private:
  struct Chunk;
  void Wait(std::unique_ptr<parallel::Work>& w, const char* what);
  // The neighbours of chunk c's virtual stage: rank and chunk there (-1: none).
  std::pair<int, int> Prev(int c) const;
  std::pair<int, int> Next(int c) const;

  std::vector<Chunk> chunks_;
  parallel::Comm* pp_;
  const int stage_, stages_;
  const double timeout_s_;
  size_t bytes_;  // one boundary tensor
  double wait_ms_ = 0, bubble_ = 0, sent_bytes_ = 0, forward_ms_ = 0;
  std::function<double()> wait_clock_;
  struct {
    bool on = false;
    uint64_t key = 0, row0 = 0, rows = 0;
  } dropout_;
};

}  // namespace keel::train
