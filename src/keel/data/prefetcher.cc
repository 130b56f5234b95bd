// Prefetcher: one producer thread, one consumer, a ring of depth_ slots guarded by one mutex. The
// producer fills a slot outside the lock (the slot is not visible to the consumer until produced_
// moves past it), so the consumer only ever blocks when the ring is empty.
#include "keel/data/prefetcher.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "keel/core/error.h"
#include "keel/core/timer.h"

namespace keel::data {

Prefetcher::Prefetcher(BatchLoader& loader, int micro_batch, int depth)
    : loader_(loader),
      micro_batch_(micro_batch),
      depth_(depth),
      slot_elems_(size_t(micro_batch) * size_t(loader.state().seq_len)),
      start_(loader.state()),
      micro_per_step_(micro_batch > 0 ? loader.local_batch() / micro_batch : 0) {
  if (depth < 1) ThrowBadInput("prefetch depth must be >= 1, got " + std::to_string(depth));
  if (micro_batch < 1 || loader.local_batch() % micro_batch != 0)
    ThrowBadInput("prefetch micro_batch " + std::to_string(micro_batch) +
                  " must divide the local batch " + std::to_string(loader.local_batch()));
  tokens_.assign(depth, std::vector<int32_t>(slot_elems_));
  targets_.assign(depth, std::vector<int32_t>(slot_elems_));
  scored_.assign(size_t(depth), 0);
  thread_ = std::thread([this] { Run(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Prefetcher::Run() {
  for (;;) {
    uint64_t slot, prev;
    bool step_start;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || produced_ - consumed_ < uint64_t(depth_); });
      if (stop_) return;
      slot = produced_ % depth_;
      prev = (produced_ + depth_ - 1) % depth_;
      step_start = produced_ % uint64_t(micro_per_step_) == 0;
    }
    try {
      // The previous slot still holds this step's count: the consumer may have read it, but the
      // producer writes only slots past consumed_.
      scored_[slot] = step_start ? loader_.StepScored() : scored_[prev];
      loader_.Next(micro_batch_, tokens_[slot].data(), targets_[slot].data());
    } catch (...) {
      // The consumer rethrows it at the batch that could not be made; the thread ends here.
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++produced_;
    }
    cv_.notify_all();
  }
}

double Prefetcher::Next(int32_t* tokens, int32_t* targets) {
  Timer wait;
  uint64_t slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return produced_ > consumed_ || error_; });
    if (produced_ == consumed_) std::rethrow_exception(error_);
    slot = consumed_ % depth_;
  }
  const double ms = wait.Millis();
  // The producer does not touch this slot until consumed_ moves past it.
  std::memcpy(tokens, tokens_[slot].data(), sizeof(int32_t) * slot_elems_);
  std::memcpy(targets, targets_[slot].data(), sizeof(int32_t) * slot_elems_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++consumed_;
  }
  cv_.notify_all();
  total_wait_ms_ += ms;
  return ms;
}

double Prefetcher::StepScored(uint64_t* scored) {
  Timer wait;
  std::unique_lock<std::mutex> lock(mu_);
  KEEL_CHECK(consumed_ % uint64_t(micro_per_step_) == 0, "Prefetcher::StepScored: mid-step");
  cv_.wait(lock, [&] { return produced_ > consumed_ || error_; });
  if (produced_ == consumed_) std::rethrow_exception(error_);
  *scored = scored_[consumed_ % depth_];
  const double ms = wait.Millis();
  total_wait_ms_ += ms;
  return ms;
}

LoaderState Prefetcher::state() const {
  if (consumed_ % micro_per_step_ != 0)
    ThrowRuntime("Prefetcher::state: called mid-step (" +
                 std::to_string(consumed_ % micro_per_step_) + " of " +
                 std::to_string(micro_per_step_) +
                 " micro-batches consumed); save at a step "
                 "boundary");
  LoaderState st = start_;
  st.position += consumed_ / micro_per_step_ * uint64_t(loader_.global_batch());
  return st;
}

}  // namespace keel::data
