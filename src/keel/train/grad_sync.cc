#include "keel/train/grad_sync.h"

#include <algorithm>

#include "keel/core/error.h"
#include "keel/core/timer.h"
#include "keel/parallel/wire_reduce.h"

namespace keel::train {

GradSync::GradSync(parallel::Comm& comm, float* grads, size_t total, size_t bucket_elems,
                   double timeout_s, std::vector<std::pair<size_t, size_t>> skip,
                   parallel::GradWire wire, float* residual)
    : comm_(comm),
      grads_(grads),
      total_(total),
      bucket_elems_(std::max<size_t>(1, bucket_elems)),
      timeout_s_(timeout_s),
      skip_(std::move(skip)),
      wire_(wire),
      residual_(residual) {}

void GradSync::Begin() {
  pending_end_ = total_;
  buckets_ = 0;
  reduced_ = 0;
  wait_ms_ = 0;
}

void GradSync::Issue(size_t lo, size_t hi) {
  // The bucket less the frozen ranges: one all-reduce per piece that remains.
  size_t at = lo;
  auto reduce = [&](size_t a, size_t b) {
    if (a >= b) return;
    inflight_.push_back(parallel::AllReduceOnWire(comm_, wire_, grads_ + a, b - a,
                                                  residual_ ? residual_ + a : nullptr));
    reduced_ += b - a;
  };
  for (const auto& [a, b] : skip_) {
    if (b <= at) continue;
    if (a >= hi) break;
    reduce(at, std::min(a, hi));
    at = std::max(at, b);
  }
  reduce(at, hi);
  ++buckets_;
  pending_end_ = lo;
}

void GradSync::Ready(size_t offset) {
  if (comm_.size() == 1) return;
  KEEL_CHECK(offset <= pending_end_, "GradSync: gradients reported final out of order");
  if (offset == 0 || pending_end_ - offset >= bucket_elems_) Issue(offset, pending_end_);
}

void GradSync::Finish() {
  if (comm_.size() == 1) return;
  if (pending_end_ > 0) Issue(0, pending_end_);
  Timer t;
  for (auto& w : inflight_) {
    double left = timeout_s_ - t.Seconds();
    if (left <= 0 || !w->Wait(left))
      throw Error(ExitCode::kTempFail,
                  "gradient all-reduce did not complete within [parallel] comm_timeout_s = " +
                      std::to_string(timeout_s_) + " s: a peer is lost or hung");
  }
  inflight_.clear();
  wait_ms_ = t.Millis();
}

}  // namespace keel::train
