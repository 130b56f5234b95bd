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
// The outer step blocks (it is rare); streaming it in fragments behind the next inner steps is
// not built. The anchor and momentum (8 bytes per parameter) are counted by StateBytesPerRank
// (StateTiers::diloco). CPU runs only (config refuses the rest): the loops below run on the host.
//
//   OuterLoop outer(store, zero, dp, {50, 0.7f, 0.9f}, GradWire::kInt8, timeout_s);
//   outer.Start();                           // after the weights are set or loaded
//   ... after each update: if (outer.Due(steps_done, last)) wait_ms += outer.Step(); ...
#pragma once

#include <cstddef>

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
};

class OuterLoop {
 public:
  OuterLoop(optim::ParamStore& store, ZeroStrategy& zero, parallel::Comm& dp, DilocoSpec spec,
            parallel::GradWire wire, double timeout_s);

  // The round starts here: the anchor takes the replica's master weights.
  void Start();
  // After a checkpoint filled the anchor (and maybe the replica's own master): a replica whose own
  // master was not in it starts from the anchor.
  void Loaded(bool own_master_found);
  // Whether an outer step follows optimizer step `steps_done` (1-based): every inner_steps, and
  // at the run's last step, so that the run ends on the replicas' common weights.
  bool Due(int steps_done, bool last) const;
  // The outer step; returns the milliseconds it waited on the replicas' sum.
  double Step();

  float* anchor() { return anchor_.as<float>(); }
  float* momentum() { return momentum_.as<float>(); }
  float* residual() { return residual_.as<float>(); }  // null unless int8 over dp > 1
  size_t size() const { return n_; }
  size_t bytes() const { return anchor_.bytes() + momentum_.bytes() + residual_.bytes(); }
  double sent_bytes() const { return sent_bytes_; }  // by the last outer step

 private:
  optim::ParamStore& store_;
  ZeroStrategy& zero_;
  parallel::Comm& dp_;
  const DilocoSpec spec_;
  const parallel::GradWire wire_;
  const double timeout_s_;
  const size_t n_;
  Buffer anchor_, momentum_, residual_;
  double sent_bytes_ = 0;
};

}  // namespace keel::train
