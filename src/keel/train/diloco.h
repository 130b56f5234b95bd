// DiLoCo's outer loop ([parallel] dp_sync = "diloco"; Douillard et al. 2023): data-parallel
// replicas train alone for `inner_steps` optimizer steps (ZeroStrategy sums no gradients), then
// average how far each moved and take one outer step from where they started:
//
//   Δ_r = anchor − master_r                   each replica's pseudo-gradient
//   Δ   = (1/dp) Σ_r Δ_r                      summed in [parallel] grad_comm's format (int8: with
//                                             its own error-feedback residual)
//   m   = μ·m + Δ;   anchor −= lr·(Δ + μ·m)   SGD with Nesterov momentum (the paper's outer
//                                             optimizer; lr 0.7, μ 0.9)
//   master_r = anchor                         every replica starts the next round from the same
//                                             weights, its AdamW moments its own
//
// With inner_steps = 1, outer lr 1 and μ 0 the round is "average the replicas' updated weights".
//
// Streaming DiLoCo (Douillard et al. 2025), `fragments` F > 1 and/or `overlap_steps` τ > 0: the
// flat weights are cut into F contiguous fragments, each with its own round of H steps, staggered
// by H/F (fragment f ends its rounds at steps s with s mod H = ((f+1)·H/F) mod H), so a sync
// sends 1/F of the weights. A fragment's pseudo-gradients travel while τ more inner steps run and
// land after them: the outer step moves the anchor as above, and the replica's weights become
//   master_r = anchor + (master_r − master_r at the send)   the τ steps' own progress kept
// (τ = 0: master_r = anchor, DiLoCo's rule). The travel is point-to-point (every replica sends its
// encoded fragment to every other; each sums all of them in rank order, so all agree bitwise):
// posted transfers progress on the comm thread beside the step's own collectives, which a queued
// all-reduce would wait behind. Each replica sends dp−1 copies of its fragment: a ring
// all-reduce's bytes (2·(dp−1)/dp copies) at dp = 2, dp/2 times them beyond. The run's last step
// lands what is in flight and ends every fragment's round at once (the classic outer step).
// Checkpoints keep what is in flight (each replica's fp32 pseudo-gradient as sent and the arrived
// average), so a run stopped with fragments in flight resumes bitwise.
//
// The anchor and momentum (8 bytes per parameter; streaming: 8 more for the sends and averages) are
// counted by StateBytesPerRank (StateTiers::diloco). CPU runs only (config refuses the rest): the
// loops below run on the host.
//
//   OuterLoop outer(store, zero, dp, {50, 0.7f, 0.9f}, GradWire::kInt8, timeout_s);
//   outer.Start();                           // after the weights are set or loaded
//   ... after each update: if (outer.Advance(steps_done, last, &wait_ms)) report sent_bytes() ...
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "keel/core/memory.h"
#include "keel/optim/param_store.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/grad_wire.h"
#include "keel/train/zero.h"

namespace keel::train {

struct DilocoSpec {
  int inner_steps = 0;  // 0: off (replicas sum gradients every step)
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  int fragments = 1;      // F, 1..inner_steps
  int overlap_steps = 0;  // τ, 0..inner_steps-1
};

class OuterLoop {
 public:
  OuterLoop(optim::ParamStore& store, ZeroStrategy& zero, parallel::Comm& dp, DilocoSpec spec,
            parallel::GradWire wire, double timeout_s);
  ~OuterLoop();

  // The round starts here: the anchor takes the replica's master weights.
  void Start();
  // After a checkpoint of step `steps_done` filled the anchor (and maybe the replica's own master
  // and what was in flight): a replica whose own master was not in it starts from the anchor;
  // fragments in flight at that step whose sends were not in it are dropped (they sync at their
  // next round). The sends and averages are saved under names that carry the schedule
  // (InFlightTag), so that a run resumed with another one does not land them.
  void Loaded(int steps_done, bool own_master_found, bool in_flight_found);
  // After optimizer step `steps_done` (1-based): lands the fragments whose overlap ends now, sends
  // those whose round ends now, and at the run's `last` step ends every round. Returns whether
  // anything was sent or landed; adds the milliseconds waited on the replicas to *wait_ms.
  bool Advance(int steps_done, bool last, double* wait_ms);
  // Before a checkpoint: waits for the fragments in flight to arrive (not landing them), so that
  // sends() and arrived() hold them.
  void Settle();

  bool streaming() const { return spec_.fragments > 1 || spec_.overlap_steps > 0; }
  std::string InFlightTag() const;  // "h10f2t3": inner steps, fragments, overlap
  // Streaming: each element's pseudo-gradient as its fragment's round last sent it, and the
  // replicas' average once it arrived; else null. Checkpoints keep them where τ > 0.
  float* sends() { return sends_.as<float>(); }
  float* arrived() { return arrived_.as<float>(); }

  float* anchor() { return anchor_.as<float>(); }
  float* momentum() { return momentum_.as<float>(); }
  float* residual() { return residual_.as<float>(); }  // null unless int8 over dp > 1
  size_t size() const { return n_; }
  size_t bytes() const {
    return anchor_.bytes() + momentum_.bytes() + residual_.bytes() + sends_.bytes() +
           arrived_.bytes();
  }
  double sent_bytes() const { return sent_bytes_; }  // by the last Advance

 private:
  struct Flight;
  static constexpr int kTagBase = 7000;  // Comm::SendAsync tags on the dp group: one per fragment
  bool Due(int fragment, int steps_done) const;
  std::pair<size_t, size_t> Range(int fragment) const;
  // Every round at once: all replicas' pseudo-gradients summed by collectives (blocking).
  double Step();
  void Send(int fragment, int steps_done);
  double Arrive(Flight& f);
  double Land(Flight& f);
  void DropFlights();

  optim::ParamStore& store_;
  ZeroStrategy& zero_;
  parallel::Comm& dp_;
  const DilocoSpec spec_;
  const parallel::GradWire wire_;
  const double timeout_s_;
  const size_t n_;
  Buffer anchor_, momentum_, residual_, sends_, arrived_;
  std::vector<std::unique_ptr<Flight>> flights_;  // in send order
  double sent_bytes_ = 0;
};

}  // namespace keel::train
