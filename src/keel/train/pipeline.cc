#include "keel/train/pipeline.h"

#include <string>

#include "keel/core/error.h"
#include "keel/core/timer.h"

namespace keel::train {
namespace {

// Tags: activations flow down the pipeline, gradients up; between two ranks each kind arrives in
// the order it was sent, which is micro-batch order on both sides.
constexpr int kActTag = 11, kGradTag = 12;

}  // namespace

Pipeline::Pipeline(model::GptModel& model, parallel::Comm* pp, int slots, double timeout_s)
    : model_(model),
      pp_(pp),
      slots_(slots),
      stage_(pp ? pp->rank() : 0),
      stages_(pp ? pp->size() : 1),
      timeout_s_(timeout_s),
      bytes_(model.boundary_elems() * DTypeSize(model.dtype())),
      tokens_(size_t(slots)),
      targets_(size_t(slots)),
      act_recv_(size_t(slots)),
      act_send_(size_t(slots)),
      grad_recv_(size_t(slots)),
      grad_send_(size_t(slots)) {
  const size_t bt = size_t(model.batch()) * model.seq_len();
  for (int s = 0; s < slots; ++s) {
    tokens_[size_t(s)].resize(bt);
    targets_[size_t(s)].resize(bt);
  }
}

Pipeline::~Pipeline() {
  // Transfers still in flight read or write the model's arena: let them finish before it goes.
  // (One that does not is stuck on a lost peer; the process is on its way to exit 75.)
  for (auto* v : {&act_recv_, &act_send_, &grad_recv_, &grad_send_})
    for (auto& w : *v) try {
        if (w) (void)w->Wait(timeout_s_);
      } catch (const std::exception&) {
      }
}

void Pipeline::Wait(std::unique_ptr<parallel::Work>& w, const char* what) {
  if (!w) return;
  Timer t;
  if (!w->Wait(timeout_s_))
    throw Error(ExitCode::kTempFail, std::string("pipeline stage ") + std::to_string(stage_) +
                                         ": " + what +
                                         " did not complete within [parallel] comm_timeout_s = " +
                                         std::to_string(timeout_s_) + " s: a peer is lost or hung");
  w.reset();
  wait_ms_ += t.Millis();
}

double Pipeline::Run(int m, const NextBatch& next, float dloss,
                     const std::function<void(int)>& before_backward, double* data_ms) {
  Timer total;
  wait_ms_ = 0;
  sent_bytes_ = 0;
  double loss = 0, waited = 0;
  const bool first = stage_ == 0, last = stage_ + 1 == stages_;
  const int S = slots_;
  auto post_act_recv = [&](int i) {
    if (!first && i < m)
      act_recv_[size_t(i % S)] =
          pp_->RecvAsync(model_.StageInput(i % S), bytes_, stage_ - 1, kActTag);
  };
  auto forward = [&](int i) {
    const size_t s = size_t(i % S);
    waited += next(tokens_[s].data(), targets_[s].data());
    Wait(act_recv_[s], "receiving activations");
    Wait(act_send_[s], "sending activations");  // the slot's output is about to be rewritten
    model_.StageForward(int(s), tokens_[s].data());
    if (last) return;
    act_send_[s] = pp_->SendAsync(model_.StageOutput(int(s)), bytes_, stage_ + 1, kActTag);
    grad_recv_[s] = pp_->RecvAsync(model_.PipeGradIn(int(s)), bytes_, stage_ + 1, kGradTag);
    sent_bytes_ += double(bytes_);
  };
  auto backward = [&](int j) {
    const size_t s = size_t(j % S);
    if (before_backward) before_backward(j);
    Wait(grad_recv_[s], "receiving gradients");
    if (!first) Wait(grad_send_[s], "sending gradients");
    loss += model_.StageBackward(int(s), tokens_[s].data(), targets_[s].data(), dloss,
                                 last ? nullptr : model_.PipeGradIn(int(s)),
                                 first ? nullptr : model_.PipeGradOut(int(s)));
    if (!first) {
      grad_send_[s] = pp_->SendAsync(model_.PipeGradOut(int(s)), bytes_, stage_ - 1, kGradTag);
      sent_bytes_ += double(bytes_);
    }
    post_act_recv(j + S);  // the slot is free again
  };
  for (int i = 0; i < std::min(S, m); ++i) post_act_recv(i);
  const int warmup = std::min(stages_ - stage_ - 1, m);
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int j = 0; j + warmup < m; ++j) {
    forward(j + warmup);
    backward(j);
  }
  for (int j = m - warmup; j < m; ++j) backward(j);
  for (auto* v : {&act_send_, &grad_send_})
    for (auto& w : *v) Wait(w, "draining sends");
  if (data_ms) *data_ms = waited;
  const double ms = total.Millis() - waited;
  bubble_ = ms > 0 ? wait_ms_ / ms : 0;
  return loss;
}

double Pipeline::Forward(const int32_t* tokens, const int32_t* targets) {
  const bool first = stage_ == 0, last = stage_ + 1 == stages_;
  if (!first) {
    auto r = pp_->RecvAsync(model_.StageInput(0), bytes_, stage_ - 1, kActTag);
    Wait(r, "receiving activations");
  }
  model_.StageForward(0, tokens);
  if (!last) {
    auto w = pp_->SendAsync(model_.StageOutput(0), bytes_, stage_ + 1, kActTag);
    Wait(w, "sending activations");
    return 0;
  }
  return model_.StageLoss(targets);
}

}  // namespace keel::train
