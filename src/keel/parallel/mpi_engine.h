// The MPI engine behind comm_mpi.cc's communicators: one thread per process owns every MPI call;
// callers queue operations and get a handle they can wait on, with a deadline. Internal to
// src/keel/parallel (it includes <mpi.h>); mpi_engine.cc says why a thread and a FIFO.
//
//   auto engine = MpiEngine::Acquire();
//   MpiWork w(engine->Submit([&] { return MpiCallOrError(...); }));
//   w.Wait(timeout_s);
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

namespace keel::parallel {

// MPI counts are ints; larger buffers are sent in pieces of this many elements (or bytes).
inline constexpr size_t kMaxChunk = size_t{1} << 30;
// SendAsync/RecvAsync's tag t travels as MPI tag kP2pTagBase + t. The blocking Send/Recv use tag 0
// (MpiComm::kTag), so the two kinds never match each other's messages.
inline constexpr int kP2pTagBase = 1;

std::string MpiErrorString(int rc);

// On the comm thread only: completes the request a nonblocking MPI call (MPI_Iallreduce, MPI_Isend,
// ...) posted, or returns `post_rc` when posting failed. Tests the request instead of blocking in
// MPI_Wait, in a hot loop for the first second and then with short naps (mpi_engine.cc says
// why), so that a rank whose peer hangs does not burn a core until comm_timeout_s.
//
//   MPI_Request req;
//   int rc = AwaitRequest(MPI_Ibarrier(comm, &req), req);
int AwaitRequest(int post_rc, MPI_Request& req, MPI_Status* status = MPI_STATUS_IGNORE);

// Completion of one operation, shared by the caller's handle and the comm thread.
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // empty on success
};

class MpiWork final : public Work {
 public:
  // `group`, `op` and `seq` name the operation in progress reports (core/collective_progress.h).
  MpiWork(std::shared_ptr<OpState> state, std::string group = "", std::string op = "",
          uint64_t seq = 0)
      : state_(std::move(state)), group_(std::move(group)), op_(std::move(op)), seq_(seq) {}

  bool Wait(double timeout_s) override {
    std::unique_lock lock(state_->mu);
    auto done = [&] { return state_->done; };
    if (timeout_s < 0) {
      state_->cv.wait(lock, done);
    } else {
      // Clamped so that a huge timeout cannot overflow the clock arithmetic.
      auto d = std::chrono::duration<double>(std::min(timeout_s, 1e9));
      auto deadline = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::nanoseconds>(d);
      if (!state_->cv.wait_until(lock, deadline, done)) return false;
    }
    if (!state_->error.empty()) throw Error(ExitCode::kRuntime, state_->error);
    return true;
  }
  // Built only when asked: a wait that timed out.
  std::string describe() const override {
    return group_.empty() ? "" : group_ + " " + op_ + " #" + std::to_string(seq_);
  }

 private:
  std::shared_ptr<OpState> state_;
  std::string group_, op_;
  uint64_t seq_ = 0;
};

// One SendAsync or RecvAsync, as the caller issued it.
struct P2pArgs {
  bool send = false;
  void* data = nullptr;  // only read when sending
  size_t bytes = 0;
  int peer = -1;
  int tag = 0;  // the caller's; on the wire kP2pTagBase + tag
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = -1;  // this rank in `comm`, for messages
  // The transfer's place in its stream's progress (core/collective_progress.h): a stream is one
  // direction and tag between two ranks of a group, in which both ends count the same messages
  // in the same order (MPI keeps them in order), so the watchdog can name the end that is behind.
  std::string stream;  // "pp#0 0->1 tag 10"
  uint64_t seq = 0;
};

struct Op;
struct Queue;

// The process's MPI: the comm thread, MPI_Init_thread/MPI_Finalize, and keel's own duplicate of
// MPI_COMM_WORLD (so keel's messages never match another library's). Shared by every MpiComm.
class MpiEngine {
 public:
  // The live engine, or a new one. MPI cannot be initialized twice in a process, so once the last
  // MpiComm is gone a new one cannot be made.
  static std::shared_ptr<MpiEngine> Acquire();

  MpiEngine(const MpiEngine&) = delete;
  MpiEngine& operator=(const MpiEngine&) = delete;
  ~MpiEngine();

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }
  MPI_Op bf16_sum() const { return bf16_sum_; }
  MPI_Op f16_sum() const { return f16_sum_; }
  int tag_ub() const { return tag_ub_; }

  // Queues `run` behind every earlier operation; the handle completes when it has run.
  std::shared_ptr<OpState> Submit(std::function<std::string()> run);
  // Queues a point-to-point op ahead of the queued collectives but behind earlier point-to-point
  // ops; the handle completes when its transfer has, which may be after later operations.
  // Posting never blocks and MPI matches point-to-point messages apart from collectives, so
  // jumping the queue is safe; it keeps a pipeline stage's activations and gradients from waiting
  // behind a backward's worth of gradient all-reduce buckets (it still waits for the one running).
  std::shared_ptr<OpState> SubmitP2p(const P2pArgs& args);
  // Queues `run` with nobody waiting for it, for clean-ups in destructors: they must neither throw
  // nor block, and the thread may be stuck on a lost peer. Skipped once the engine is stopping.
  void Post(std::function<std::string()> run);
  // Submit and wait for it, up to the default deadline (comm_wait.h; past it keel::Error
  // kTempFail names `group`, `op` and `seq`); throws keel::Error if the MPI call failed.
  void Run(std::function<std::string()> run, const std::string& group, const std::string& op,
           uint64_t seq = 0);

 private:
  MpiEngine();
  std::shared_ptr<OpState> Enqueue(Op op);
  void Loop(std::shared_ptr<Queue> q, std::promise<std::string>& started);

  std::shared_ptr<Queue> queue_;
  std::thread thread_;
  int rank_ = -1;
  int size_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL, f16_sum_ = MPI_OP_NULL;
  int tag_ub_ = 32767;
};

}  // namespace keel::parallel
