#include "keel/train/step.h"

#include <cstring>

#include "keel/ckpt/checkpoint_model.h"

namespace keel::train {
namespace {

std::vector<optim::ParamRange> RangesOf(const model::ParamLayout& layout,
                                        const std::vector<bool>& frozen) {
  std::vector<optim::ParamRange> r;
  const auto& ps = layout.params();
  for (size_t i = 0; i < ps.size(); ++i)
    r.push_back({ps[i].offset, ps[i].numel, ps[i].decay, !frozen.empty() && frozen[i]});
  return r;
}

}  // namespace

TrainStep::TrainStep(const StepSpec& spec, parallel::Comm& dp_comm)
    : spec_(spec), comm_(dp_comm), layout_(model::ParamLayout::Gpt2(spec.model)) {
  store_ = std::make_unique<optim::ParamStore>(model::StateShapeOf(layout_, spec.dtype), spec.dims,
                                               dp_comm.rank(), RangesOf(layout_, spec.frozen),
                                               spec.hyper);
  zero_ = std::make_unique<ZeroStrategy>(*store_, layout_, dp_comm, spec.bucket_elems,
                                         spec.comm_timeout_s);
  model_ = std::make_unique<model::GptModel>(spec.model, spec.dtype, spec.micro_batch, spec.seq_len,
                                             spec.recompute, zero_.get());
  tokens_.resize(size_t(spec.micro_batch) * spec.seq_len);
  targets_.resize(tokens_.size());
}

TrainStep::~TrainStep() = default;

void TrainStep::SetWeights(const float* full) {
  std::memcpy(store_->master(), full + store_->state_lo(),
              4 * (store_->state_hi() - store_->state_lo()));
  zero_->PublishWeights();
}

void TrainStep::Restored(int optimizer_step) {
  store_->set_step(optimizer_step);
  zero_->PublishWeights();  // bf16 working weights: the rounding of the restored master, exactly
}

double TrainStep::ForwardBackward(int n_micro, const NextBatch& next, float dloss,
                                  double* data_ms) {
  zero_->BeginStep();
  double loss = 0, waited = 0;
  for (int k = 0; k < n_micro; ++k) {
    waited += next(tokens_.data(), targets_.data());
    zero_->BeginMicroBatch(k == n_micro - 1);
    loss += model_->ForwardBackward(tokens_.data(), targets_.data(), dloss);
  }
  zero_->FinishBackward();
  if (data_ms) *data_ms = waited;
  return comm_.AllReduceSum(loss);
}

double TrainStep::Update(float lr, float grad_clip, const std::function<void()>& before_update) {
  const double norm = zero_->GradNorm();
  if (before_update) before_update();
  zero_->Update(lr, optim::ClipScale(norm, grad_clip));
  return norm;
}

double TrainStep::Forward(const int32_t* tokens, const int32_t* targets) {
  return model_->Forward(tokens, targets);
}

ckpt::StateView TrainStep::StateView() {
  ckpt::StateView v;
  v.tensors = ckpt::TensorSpecs(layout_);
  v.buffers = {
      {"master", store_->master()}, {"adam_m", store_->adam_m()}, {"adam_v", store_->adam_v()}};
  v.lo = store_->state_lo();
  v.hi = spec_.dims.zero >= 1 ? store_->state_hi() : 0;
  return v;
}

nlohmann::json TrainStep::MemoryBytes() const {
  const parallel::StateBytes b = store_->bytes();
  return {{"master", b.master},
          {"working", b.working},
          {"biases", b.biases},
          {"grads", b.grads},
          {"adam_moments", b.moments},
          {"zero_buffers", zero_->buffer_bytes()},
          {"activations", model_->activation_plan().total_bytes}};
}

}  // namespace keel::train
