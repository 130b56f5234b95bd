// Data-parallel gradient averaging in buckets, overlapped with backward.
//
// Backward reports, segment by segment, that the gradients [offset, end) of the flat buffer are
// final (ZeroStrategy::GradsDone at stages 0 and 1). GradSync all-reduces each newly final slice as
// soon as it reaches the bucket size, so the communication of layer l runs while layer l-1
// computes; Finish waits for the rest. With one rank it does nothing.
//
// Frozen ranges (`skip`) are never reduced: their gradients are discarded before the norm, so a
// LoRA run sends its adapters' gradients only.
//
// `wire` ([parallel] grad_comm): the format the sums travel in (parallel/wire_reduce.h); int8
// keeps its error feedback in `residual` (`total` floats, indexed as `grads`).
//
//   GradSync sync(comm, grads, total, bucket_elems, timeout_s, frozen);
//   sync.Begin();
//   ... backward: sync.Ready(layout.segment_start(s)) as each segment s finishes ...
//   sync.Finish();   // throws keel::Error(kTempFail) if a peer does not answer in time
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "keel/parallel/comm.h"
#include "keel/parallel/grad_wire.h"

namespace keel::train {

class GradSync {
 public:
  // `skip`: sorted, disjoint [first, second) ranges of the flat buffer not to reduce.
  GradSync(parallel::Comm& comm, float* grads, size_t total, size_t bucket_elems, double timeout_s,
           std::vector<std::pair<size_t, size_t>> skip = {},
           parallel::GradWire wire = parallel::GradWire::kF32, float* residual = nullptr);

  void Begin();
  void Ready(size_t offset);
  void Finish();

  double wait_ms() const { return wait_ms_; }      // time Finish blocked, last step
  int buckets() const { return buckets_; }         // buckets issued, last step
  size_t reduced() const { return reduced_; }      // elements all-reduced, last step
  bool idle() const { return inflight_.empty(); }  // no sum issued and not yet waited for

 private:
  void Issue(size_t lo, size_t hi);
  parallel::Comm& comm_;
  float* grads_;
  size_t total_, bucket_elems_;
  double timeout_s_;
  std::vector<std::pair<size_t, size_t>> skip_;
  parallel::GradWire wire_;
  float* residual_;
  size_t reduced_ = 0;
  size_t pending_end_ = 0;
  std::vector<std::unique_ptr<parallel::Work>> inflight_;
  double wait_ms_ = 0;
  int buckets_ = 0;
};

}  // namespace keel::train
