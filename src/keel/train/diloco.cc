#include "keel/train/diloco.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/core/timer.h"
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
  KEEL_CHECK(spec.fragments >= 1 && spec.fragments <= spec.inner_steps && spec.overlap_steps >= 0 &&
                 spec.overlap_steps < spec.inner_steps,
             "OuterLoop: fragments must be in 1..inner_steps and overlap_steps below inner_steps");
  if (streaming()) {
    // Zeroed: checkpoints write them whole, and a first touch mid-run would cost the step its
    // page faults (80 ms for a 3.2M-element fragment on a 2-vCPU VM).
    sends_ = Buffer(store.backend(), 4 * n_);
    arrived_ = Buffer(store.backend(), 4 * n_);
    store.backend().Zero(sends_.data(), 4 * n_);
    store.backend().Zero(arrived_.data(), 4 * n_);
  }
}

// One fragment's round in flight: this replica's encoded send, the other replicas' arriving.
struct OuterLoop::Flight {
  int fragment = 0;
  int land_at = 0;               // the step after which it lands
  bool arrived = false;          // arrived() holds the replicas' average
  std::vector<char> send, recv;  // encoded; recv holds dp−1 peers' in rank order
  std::vector<std::unique_ptr<parallel::Work>> ops;
};

OuterLoop::~OuterLoop() {
  // Transfers still posted write into their flight's buffers: wait for them (a lost peer is
  // waited for once, up to the timeout), and leak the buffers of any that did not settle.
  const Timer since;
  for (auto& f : flights_) {
    bool settled = true;
    for (auto& op : f->ops) settled = parallel::Settled(*op, since, timeout_s_) && settled;
    if (!settled) (void)f.release();
  }
}

void OuterLoop::DropFlights() {
  // Posted transfers write into their flight's buffers: done before the buffers go.
  for (auto& f : flights_)
    for (auto& op : f->ops) parallel::WaitOrLost(*op, timeout_s_, "DiLoCo's fragment exchange");
  flights_.clear();
}

void OuterLoop::Start() {
  store_.backend().Copy(anchor(), store_.master_data(), 4 * n_);
  DropFlights();
}

std::string OuterLoop::InFlightTag() const {
  return "h" + std::to_string(spec_.inner_steps) + "f" + std::to_string(spec_.fragments) + "t" +
         std::to_string(spec_.overlap_steps);
}

void OuterLoop::Loaded(int steps_done, bool own_master_found, bool in_flight_found) {
  if (!own_master_found) store_.backend().Copy(store_.master_data(), anchor(), 4 * n_);
  DropFlights();
  if (spec_.overlap_steps == 0) return;
  // What was in flight after step `steps_done` (sent at d, landing at d + τ > steps_done), in
  // send order; the checkpoint holds its sends and, settled before the save, its averages.
  std::string dropped;
  for (int d = std::max(1, steps_done - spec_.overlap_steps + 1); d <= steps_done; ++d)
    for (int f = 0; f < spec_.fragments; ++f) {
      if (!Due(f, d)) continue;
      if (!in_flight_found || !own_master_found) {
        dropped += (dropped.empty() ? "" : ", ") + std::to_string(f) + " (sent at step " +
                   std::to_string(d) + ")";
        continue;
      }
      auto flight = std::make_unique<Flight>();
      flight->fragment = f;
      flight->land_at = d + spec_.overlap_steps;
      flight->arrived = true;
      flights_.push_back(std::move(flight));
    }
  if (!dropped.empty() && dp_.rank() == 0)
    Log("keel: DiLoCo: the checkpoint holds no fragments in flight for this schedule (%s): "
        "fragment(s) %s are dropped and sync at their next round",
        InFlightTag().c_str(), dropped.c_str());
}

bool OuterLoop::Due(int fragment, int steps_done) const {
  const int h = spec_.inner_steps;
  return steps_done % h == (fragment + 1) * h / spec_.fragments % h;
}

std::pair<size_t, size_t> OuterLoop::Range(int fragment) const {
  // Whole int8 blocks, so that a fragment's encoding is the one its elements would get alone.
  auto edge = [&](int f) {
    const size_t at = n_ * size_t(f) / size_t(spec_.fragments);
    return f == spec_.fragments ? n_
                                : std::min(n_, at / parallel::kInt8Block * parallel::kInt8Block);
  };
  return {edge(fragment), edge(fragment + 1)};
}

bool OuterLoop::Advance(int steps_done, bool last, double* wait_ms) {
  sent_bytes_ = 0;
  if (!streaming()) {
    if (!last && steps_done % spec_.inner_steps != 0) return false;
    *wait_ms += Step();
    return true;
  }
  bool any = false;
  // Land first: a fragment landing now may be due again only a full round later (τ < H).
  for (size_t i = 0; i < flights_.size();) {
    if (!last && flights_[i]->land_at != steps_done) {
      ++i;
      continue;
    }
    *wait_ms += Land(*flights_[i]);
    flights_.erase(flights_.begin() + i);
    any = true;
  }
  if (last) {
    *wait_ms += Step();
    return true;
  }
  for (int f = 0; f < spec_.fragments; ++f) {
    if (!Due(f, steps_done)) continue;
    Send(f, steps_done);
    any = true;
    if (spec_.overlap_steps == 0) {
      *wait_ms += Land(*flights_.back());
      flights_.pop_back();
    }
  }
  return any;
}

void OuterLoop::Send(int fragment, int steps_done) {
  const auto [lo, hi] = Range(fragment);
  const size_t k = hi - lo;
  auto flight = std::make_unique<Flight>();
  flight->fragment = fragment;
  flight->land_at = steps_done + spec_.overlap_steps;
  const float* w = static_cast<const float*>(store_.master_data());
  const float* a = anchor();
  // The pseudo-gradient, kept in sends() (Land's "weights at the send" is the anchor less it) and
  // encoded (int8: with this replica's residual carried); every replica sums the encoded ones.
  float* delta = sends() + lo;
  for (size_t i = 0; i < k; ++i) delta[i] = a[lo + i] - w[lo + i];
  const size_t bytes = parallel::WireBytes(wire_, k);
  flight->send.resize(bytes);
  parallel::Encode(wire_, delta, k, flight->send.data(), residual() ? residual() + lo : nullptr);
  const int dp = dp_.size(), me = dp_.rank();
  flight->recv.resize(bytes * size_t(dp - 1));
  // One tag per fragment: a fragment is in flight at most once (τ < H).
  const int tag = kTagBase + fragment;
  for (int p = 0, slot = 0; p < dp; ++p) {
    if (p == me) continue;
    flight->ops.push_back(
        dp_.RecvAsync(flight->recv.data() + bytes * size_t(slot++), bytes, p, tag));
  }
  for (int p = 0; p < dp; ++p)
    if (p != me) flight->ops.push_back(dp_.SendAsync(flight->send.data(), bytes, p, tag));
  sent_bytes_ += double(bytes) * (dp - 1);
  flights_.push_back(std::move(flight));
}

double OuterLoop::Arrive(Flight& f) {
  double ms = 0;
  for (auto& op : f.ops) ms += parallel::WaitOrLost(*op, timeout_s_, "DiLoCo's fragment exchange");
  f.ops.clear();
  const auto [lo, hi] = Range(f.fragment);
  const size_t k = hi - lo, bytes = parallel::WireBytes(wire_, k);
  float* avg = arrived() + lo;
  std::fill(avg, avg + k, 0.0f);
  // In rank order on every replica: the same sum everywhere.
  for (int p = 0, slot = 0; p < dp_.size(); ++p)
    parallel::DecodeAdd(
        wire_, p == dp_.rank() ? f.send.data() : f.recv.data() + bytes * size_t(slot++), k, avg);
  const float inv = 1.0f / float(dp_.size());
  for (size_t i = 0; i < k; ++i) avg[i] *= inv;
  f.send = {};
  f.recv = {};
  f.arrived = true;
  return ms;
}

double OuterLoop::Land(Flight& f) {
  const double ms = f.arrived ? 0.0 : Arrive(f);
  const auto [lo, hi] = Range(f.fragment);
  float* w = static_cast<float*>(store_.master_data());
  float* a = anchor();
  float* m = momentum();
  const float* d = arrived();
  const float* sent = sends();
  const float lr = spec_.outer_lr, mu = spec_.outer_momentum;
  const bool keep_progress = spec_.overlap_steps > 0;
  for (size_t i = lo; i < hi; ++i) {
    m[i] = mu * m[i] + d[i];
    const float before = a[i];
    a[i] -= lr * (d[i] + mu * m[i]);
    // The weights at the send were before − sent[i]: what the replica made of them since stays.
    w[i] = keep_progress ? a[i] + (w[i] - (before - sent[i])) : a[i];
  }
  zero_.PublishWeights(lo, hi);  // the fragment's bf16 working weights, not the whole model's
  return ms;
}

void OuterLoop::Settle() {
  for (auto& f : flights_)
    if (!f->arrived) Arrive(*f);
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
