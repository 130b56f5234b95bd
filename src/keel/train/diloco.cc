#include "keel/train/diloco.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/wire_reduce.h"

namespace keel::train {

OuterLoop::OuterLoop(optim::ParamStore& store, ZeroStrategy& zero, parallel::Comm& dp,
                     DilocoSpec spec, parallel::GradWire wire, double timeout_s)
    : store_(store),
      zero_(zero),
      dp_(dp),
      spec_(spec),
      wire_(wire),
      timeout_s_(timeout_s),
      n_(store.state_hi() - store.state_lo()) {
  KEEL_CHECK(store.master_dtype() == DType::kF32 && store.master_data() && !store.compact(),
             "OuterLoop: DiLoCo needs the whole fp32 master in memory (config validation says so)");
  KEEL_CHECK(store.backend().host_visible(), "OuterLoop: DiLoCo runs on the CPU");
  anchor_ = Buffer(store.backend(), 4 * n_);
  momentum_ = Buffer(store.backend(), 4 * n_);
  store.backend().Zero(momentum_.data(), 4 * n_);
  if (wire == parallel::GradWire::kInt8 && dp.size() > 1) {
    residual_ = Buffer(store.backend(), 4 * n_);
    store.backend().Zero(residual_.data(), 4 * n_);
  }
}

void OuterLoop::Start() { store_.backend().Copy(anchor(), store_.master_data(), 4 * n_); }

void OuterLoop::Loaded(bool own_master_found) {
  if (own_master_found) return;
  store_.backend().Copy(store_.master_data(), anchor(), 4 * n_);
}

bool OuterLoop::Due(int steps_done, bool last) const {
  return last || steps_done % spec_.inner_steps == 0;
}

double OuterLoop::Step() {
  // host: the master, anchor and momentum are host memory (OuterLoop's constructor checks).
  float* w = static_cast<float*>(store_.master_data());
  float* a = anchor();
  float* m = momentum();
  for (size_t i = 0; i < n_; ++i) w[i] = a[i] - w[i];
  // In pieces, two in flight: MPI counts bytes in ints, and each piece's wire buffers live while
  // it travels (kPiece elements: at most 2 x 2 x 64 MiB of them at once in fp32).
  constexpr size_t kPiece = size_t(1) << 24;
  sent_bytes_ = 0;
  double ms = 0;
  std::vector<std::unique_ptr<parallel::Work>> flight;
  auto wait_oldest = [&] {
    ms += parallel::WaitOrLost(*flight.front(), timeout_s_, "DiLoCo's pseudo-gradient all-reduce");
    flight.erase(flight.begin());
  };
  for (size_t at = 0; at < n_; at += kPiece) {
    const size_t k = std::min(kPiece, n_ - at);
    if (flight.size() == 2) wait_oldest();
    flight.push_back(
        parallel::AllReduceOnWire(dp_, wire_, w + at, k, residual() ? residual() + at : nullptr));
    sent_bytes_ += parallel::WireSentBytes(wire_, k, dp_.size(), /*all_reduce=*/true);
  }
  while (!flight.empty()) wait_oldest();
  const float inv = 1.0f / float(dp_.size()), lr = spec_.outer_lr, mu = spec_.outer_momentum;
  for (size_t i = 0; i < n_; ++i) {
    const float d = w[i] * inv;
    m[i] = mu * m[i] + d;
    a[i] -= lr * (d + mu * m[i]);
    w[i] = a[i];
  }
  zero_.PublishWeights();  // the bf16 working copy (and biases) from the new master
  return ms;
}

}  // namespace keel::train
