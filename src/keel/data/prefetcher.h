// Background batch preparation: a thread pulls the loader's next micro-batches (BatchLoader::Next)
// into a small ring of buffers while the trainer computes, so the trainer's data time becomes the
// time it actually waits, near zero once the ring is full.
//
// The content is deterministic: the k-th Next() of the prefetcher is exactly the k-th
// BatchLoader::Next() the loader would have given, whatever the thread timing.
//
//   BatchLoader loader(...);
//   Prefetcher pf(loader, micro_batch, /*depth=*/3);          // owns the loader from here on
//   double waited_ms = pf.Next(tokens, targets);
//   LoaderState st = pf.state();                              // what has been consumed
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "keel/data/loader.h"

namespace keel::data {

class Prefetcher {
 public:
  // Starts the thread. From here until destruction the loader belongs to the thread: the caller
  // must not use it (it is not thread-safe). depth >= 1 micro-batches are prepared ahead.
  Prefetcher(BatchLoader& loader, int micro_batch, int depth);
  // Stops the thread, even mid-stream; the prepared but unconsumed batches are dropped.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Copies the next micro-batch, (micro_batch, T) each, and returns the milliseconds spent
  // waiting for it. Rethrows an error the thread met while reading.
  double Next(int32_t* tokens, int32_t* targets);

  // At a step boundary: the targets trained on in the global batch of the step whose first
  // micro-batch comes next (BatchLoader::StepScored) into *scored; returns the milliseconds spent
  // waiting for it. Rethrows an error the thread met.
  double StepScored(uint64_t* scored);

  // The loader state after what has been consumed (not what was prepared ahead), so it can be
  // saved with a checkpoint. Only at a step boundary, like BatchLoader::state().
  LoaderState state() const;

  double total_wait_ms() const { return total_wait_ms_; }

 private:
  void Run();

  BatchLoader& loader_;
  const int micro_batch_, depth_;
  const size_t slot_elems_;
  const LoaderState start_;
  const int micro_per_step_;

  std::vector<std::vector<int32_t>> tokens_, targets_;  // ring of depth_ slots
  std::vector<uint64_t> scored_;  // per slot: its step's BatchLoader::StepScored
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t produced_ = 0, consumed_ = 0;  // micro-batches; slot = count % depth_
  bool stop_ = false;
  std::exception_ptr error_;
  double total_wait_ms_ = 0;
  std::thread thread_;  // last: started after everything it reads is constructed
};

}  // namespace keel::data
