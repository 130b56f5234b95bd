// Data-parallel gradient averaging in buckets, overlapped with backward.
//
// Backward reports, segment by segment, that the gradients [offset, end) of the flat buffer are
// final (ZeroStrategy::GradsDone at stages 0 and 1). GradSync all-reduces each newly final slice as
// soon as it reaches the bucket size, so the communication of layer l runs while layer l-1
// computes; Finish waits for the rest. With one rank it does nothing.
//
//   GradSync sync(comm, grads, total, bucket_elems, timeout_s);
//   sync.Begin();
//   ... backward: sync.Ready(layout.segment_start(s)) as each segment s finishes ...
//   sync.Finish();   // throws keel::Error(kTempFail) if a peer does not answer in time
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "keel/parallel/comm.h"

namespace keel::train {

class GradSync {
 public:
  GradSync(parallel::Comm& comm, float* grads, size_t total, size_t bucket_elems, double timeout_s);

  void Begin();
  void Ready(size_t offset);
  void Finish();

  double wait_ms() const { return wait_ms_; }  // time Finish blocked, last step
  int buckets() const { return buckets_; }     // buckets issued, last step

 private:
  void Issue(size_t lo, size_t hi);
  parallel::Comm& comm_;
  float* grads_;
  size_t total_, bucket_elems_;
  double timeout_s_;
  size_t pending_end_ = 0;
  std::vector<std::unique_ptr<parallel::Work>> inflight_;
  double wait_ms_ = 0;
  int buckets_ = 0;
};

}  // namespace keel::train
