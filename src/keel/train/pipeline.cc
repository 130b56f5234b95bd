#include "keel/train/pipeline.h"

#include <string>

#include "keel/core/error.h"
#include "keel/core/timer.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/pipeline_schedule.h"

namespace keel::train {
namespace {

// Tags by the receiving chunk: activations flow down the virtual stages, gradients up. Between
// two ranks each (kind, chunk) stream arrives in the order it was sent, micro-batch order.
int ActTag(int chunk) { return 10 + 2 * chunk; }
int GradTag(int chunk) { return 11 + 2 * chunk; }

}  // namespace

struct Pipeline::Chunk {
  model::Transformer* model;
  int slots;
  std::vector<std::unique_ptr<parallel::Work>> act_recv, act_send, grad_recv, grad_send;
  // Chunk 0 also keeps each micro-batch's tokens and targets, for every chunk: a micro-batch's
  // data lives from chunk 0's forward to chunk 0's backward, the last of its units here.
  std::vector<std::vector<int32_t>> tokens, targets;
};

Pipeline::Pipeline(std::vector<model::Transformer*> chunks, parallel::Comm* pp, double timeout_s)
    : pp_(pp), stage_(pp ? pp->rank() : 0), stages_(pp ? pp->size() : 1), timeout_s_(timeout_s) {
  const model::Transformer& m0 = *chunks.front();
  bytes_ = m0.boundary_elems() * DTypeSize(m0.dtype());
  const size_t bt = size_t(m0.batch()) * m0.seq_len();
  for (model::Transformer* m : chunks) {
    Chunk c{m, m->slots(), {}, {}, {}, {}, {}, {}};
    for (auto* v : {&c.act_recv, &c.act_send, &c.grad_recv, &c.grad_send})
      v->resize(size_t(c.slots));
    if (chunks_.empty()) {  // chunk 0 keeps every chunk's micro-batches (see Chunk)
      c.tokens.assign(size_t(c.slots), std::vector<int32_t>(bt));
      c.targets.assign(size_t(c.slots), std::vector<int32_t>(bt));
    }
    chunks_.push_back(std::move(c));
  }
}

Pipeline::~Pipeline() = default;

bool Pipeline::Quiesce() {
  const Timer since;
  bool done = true;
  for (Chunk& c : chunks_)
    for (auto* v : {&c.act_recv, &c.act_send, &c.grad_recv, &c.grad_send})
      for (auto& w : *v)
        if (w) done = parallel::Settled(*w, since, timeout_s_) && done;
  return done;
}

std::pair<int, int> Pipeline::Prev(int c) const {
  if (stage_ > 0) return {stage_ - 1, c};
  return c > 0 ? std::pair{stages_ - 1, c - 1} : std::pair{-1, -1};
}

std::pair<int, int> Pipeline::Next(int c) const {
  if (stage_ + 1 < stages_) return {stage_ + 1, c};
  return c + 1 < int(chunks_.size()) ? std::pair{0, c + 1} : std::pair{-1, -1};
}

void Pipeline::Wait(std::unique_ptr<parallel::Work>& w, const char* what) {
  if (!w) return;
  wait_ms_ += parallel::WaitOrLost(*w, timeout_s_,
                                   "pipeline stage " + std::to_string(stage_) + ": " + what);
  w.reset();
}

double Pipeline::Run(int m, const NextBatch& next, float dloss,
                     const std::function<void(int)>& before_backward, double* data_ms) {
  Timer total;
  wait_ms_ = 0;
  sent_bytes_ = 0;
  forward_ms_ = 0;
  double loss = 0, waited = 0;
  const int v = int(chunks_.size());
  KEEL_CHECK(v == 1 || m % stages_ == 0,
             "pipeline: interleaving needs the micro-batches to be a multiple of the stages");
  const std::vector<int> need = parallel::PipelineSlots(stages_, stage_, v, m);
  for (int c = 0; c < v; ++c)
    KEEL_CHECK(need[size_t(c)] <= chunks_[size_t(c)].slots,
               "pipeline: the schedule keeps more micro-batches than the model has slots for");
  // The last virtual stage keeps one copy of the head's buffers (model/activations.cc): it must
  // run each micro-batch's backward right after its forward.
  KEEL_CHECK(stage_ + 1 < stages_ || need.back() == 1,
             "pipeline: the last stage would keep more than one micro-batch in flight");
  auto post_act_recv = [&](int c, int i) {
    Chunk& ch = chunks_[size_t(c)];
    const auto [rank, chunk] = Prev(c);
    if (rank < 0 || i >= m) return;
    const int s = i % ch.slots;
    ch.act_recv[size_t(s)] = pp_->RecvAsync(ch.model->StageInput(s), bytes_, rank, ActTag(c));
  };
  auto forward = [&](int c, int i) {
    Chunk& ch = chunks_[size_t(c)];
    Chunk& c0 = chunks_[0];
    const size_t s = size_t(i % ch.slots), d = size_t(i % c0.slots);
    if (c == 0) waited += next(c0.tokens[d].data(), c0.targets[d].data());
    Wait(ch.act_recv[s], "receiving activations");
    Wait(ch.act_send[s], "sending activations");  // the slot's output is about to be rewritten
    const Timer fwd;
    const double waited_before = wait_clock_ ? wait_clock_() : 0;
    if (dropout_.on)
      ch.model->SetDropout(int(s), dropout_.key, dropout_.row0 + uint64_t(i) * dropout_.rows);
    ch.model->StageForward(int(s), c0.tokens[d].data());
    forward_ms_ += fwd.Millis() - ((wait_clock_ ? wait_clock_() : 0) - waited_before);
    const auto [rank, chunk] = Next(c);
    if (rank < 0) return;
    ch.act_send[s] = pp_->SendAsync(ch.model->StageOutput(int(s)), bytes_, rank, ActTag(chunk));
    ch.grad_recv[s] = pp_->RecvAsync(ch.model->PipeGradIn(int(s)), bytes_, rank, GradTag(c));
    sent_bytes_ += double(bytes_);
  };
  auto backward = [&](int c, int i) {
    Chunk& ch = chunks_[size_t(c)];
    Chunk& c0 = chunks_[0];
    const size_t s = size_t(i % ch.slots), d = size_t(i % c0.slots);
    if (before_backward) before_backward(i);
    const auto [prev, prev_chunk] = Prev(c);
    const bool last = Next(c).first < 0, first = prev < 0;
    Wait(ch.grad_recv[s], "receiving gradients");
    if (!first) Wait(ch.grad_send[s], "sending gradients");
    loss += ch.model->StageBackward(int(s), c0.tokens[d].data(), c0.targets[d].data(), dloss,
                                    last ? nullptr : ch.model->PipeGradIn(int(s)),
                                    first ? nullptr : ch.model->PipeGradOut(int(s)));
    if (!first) {
      ch.grad_send[s] =
          pp_->SendAsync(ch.model->PipeGradOut(int(s)), bytes_, prev, GradTag(prev_chunk));
      sent_bytes_ += double(bytes_);
    }
    post_act_recv(c, i + ch.slots);  // the slot is free again
  };
  for (int c = 0; c < v; ++c)
    for (int i = 0; i < chunks_[size_t(c)].slots; ++i) post_act_recv(c, i);
  for (const parallel::PipeUnit& u : parallel::PipelineUnits(stages_, stage_, v, m))
    u.forward ? forward(u.chunk, u.micro) : backward(u.chunk, u.micro);
  // The slots keep their masks until a backward is done with them: cleared for evaluation.
  for (Chunk& ch : chunks_) ch.model->ClearDropout();
  dropout_.on = false;
  for (Chunk& ch : chunks_)
    for (auto* w : {&ch.act_send, &ch.grad_send})
      for (auto& x : *w) Wait(x, "draining sends");
  if (data_ms) *data_ms = waited;
  const double ms = total.Millis() - waited;
  bubble_ = ms > 0 ? wait_ms_ / ms : 0;
  return loss;
}

double Pipeline::Forward(const int32_t* tokens, const int32_t* targets) {
  double loss = 0;
  for (int c = 0; c < int(chunks_.size()); ++c) {
    model::Transformer& m = *chunks_[size_t(c)].model;
    if (const auto [rank, chunk] = Prev(c); rank >= 0) {
      auto r = pp_->RecvAsync(m.StageInput(0), bytes_, rank, ActTag(c));
      Wait(r, "receiving activations");
    }
    m.StageForward(0, tokens);
    if (const auto [rank, chunk] = Next(c); rank >= 0) {
      auto w = pp_->SendAsync(m.StageOutput(0), bytes_, rank, ActTag(chunk));
      Wait(w, "sending activations");
    } else {
      loss = m.StageLoss(targets);
    }
  }
  return loss;
}

}  // namespace keel::train
