// The MPI engine of comm_mpi.cc. One dedicated thread owns every MPI call in the process; callers
// put operations on a FIFO queue and get a handle they can wait on, with a deadline.
//
// Why a thread: MPI's own nonblocking collectives (MPI_Iallreduce) only make progress while some
// thread is inside the MPI library, so a caller busy in backward would see its all-reduce start
// when it next calls MPI_Test/MPI_Wait, i.e. not overlap at all. A thread that sits in blocking
// MPI calls keeps the transfer moving while the caller computes. Owning all calls on that thread
// also means MPI needs only MPI_THREAD_SERIALIZED, the cheapest level that is safe here.
//
// Why a FIFO: every rank must issue collectives in the same order (MPI's rule); running them one
// at a time in issue order keeps that true by construction and makes completion order equal issue
// order, which the gradient buckets rely on.
//
// Sub-communicators (Split) share the one thread and queue rather than getting their own: a second
// thread inside MPI would need MPI_THREAD_MULTIPLE, and one FIFO keeps a single issue order across
// all groups, so ranks that agree on that order cannot deadlock one group against another.
//
// Collectives and blocking sends are awaited by testing a nonblocking request (AwaitRequest):
// Open MPI's blocking calls poll in a hot loop for as long as they wait, so a rank whose peer hung
// burned a whole core until comm_timeout_s ended the run. Large collectives test a barrier that
// way and then make the blocking call (comm_mpi.cc's Collective says why).
//
// Asynchronous point-to-point (SendAsync/RecvAsync, for pipeline stages) is the one exception to
// "one op at a time": its FIFO op only posts MPI_Isend/MPI_Irecv and returns, and the thread tests
// the posted requests between ops (and while waiting for the next one), completing the handle when
// all of its requests have. A blocking MPI_Send would deadlock two stages that each send a large
// (rendezvous) message to the other before receiving; posted requests cannot, and they keep
// progressing inside whatever blocking collective the thread runs meanwhile.
#include "keel/parallel/mpi_engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "keel/core/collective_progress.h"
#include "keel/core/dtype.h"
#include "keel/core/log.h"
#include "keel/parallel/comm_wait.h"

namespace keel::parallel {

// An operation for the comm thread: `run` makes the MPI calls and returns "" or an error message.
// A point-to-point op has `p2p` instead: the thread posts its requests and completes `state` later.
struct Op {
  std::function<std::string()> run;
  std::shared_ptr<OpState> state;
  bool cleanup = false;  // local and quick (a Split's MPI_Comm_free); nobody waits for it
  std::optional<P2pArgs> p2p;
};

// The queue, shared between the engine and its thread through a shared_ptr so that the thread
// may outlive the engine when it is stuck in MPI at shutdown (see ~MpiEngine).
struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> ops;
  // The first `p2p_queued` ops are point-to-point posts, in their submission order: they go ahead
  // of queued collectives (see SubmitP2p).
  size_t p2p_queued = 0;
  bool busy = false;         // the thread is running an op taken off `ops`, other than a clean-up
  size_t p2p_in_flight = 0;  // point-to-point ops posted and not yet complete
  bool stop = false;         // drain what is queued and posted, then finalize and exit
  bool abandoned = false;    // the engine gave up on a stuck shutdown: exit, without MPI_Finalize
  bool exited = false;
};

namespace {

// How long the comm thread sleeps between tests of posted point-to-point requests when it has no
// op to run. Not a blocking wait inside MPI: that thread is the only one allowed in MPI, so it must
// come back for new ops. Not a hot spin either: the ranks share a few cores with the compute
// threads. ~50 us adds at most that much latency to a transfer that takes far longer.
constexpr std::chrono::microseconds kP2pPollInterval{50};
// AwaitRequest's backoff. The first kSpinFor of a wait tests in a hot loop: Open MPI moves a
// collective's data only inside our calls (each round of MPI_Iallreduce's schedule, each fragment
// over TCP), so a nap there slows a transfer that is streaming: naps of up to 1 ms from 0.5 ms on
// raised a dp 2 step's gradient wait from 39 to 181 ms. Past kSpinFor the wait is a lost or hung
// peer (or a straggler seconds behind): it naps kNap between tests, ~5,000 wake-ups a second
// instead of a spinning core, and a transfer that streams after it slows by at most kNap a round.
constexpr std::chrono::milliseconds kSpinFor{1000};
constexpr std::chrono::microseconds kNap{200};
// How long destruction waits for operations still in flight before giving up on them (they are
// stuck on a peer that is gone or hung; the process is about to exit with code 75 anyway).
constexpr double kShutdownGraceS = 5.0;

// MPI has no bf16 type or sum, so bf16 travels as MPI_UINT16_T with this op. Each pair is added
// in fp32 and rounded to nearest even, as NCCL does; a+b and b+a round alike, so the op is
// commutative and every rank ends with the same bits whatever order MPI combines them in.
void SumBf16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = ToBf16(ToFloat(a[i]) + ToFloat(b[i]));
}

// The same for fp16 (train.precision = "fp16" under tensor parallelism): added in fp32, rounded
// to nearest even (overflow to infinity, which the loss scaler then sees).
void SumF16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const f16*>(in);
  auto* b = static_cast<f16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = ToF16(ToFloat(a[i]) + ToFloat(b[i]));
}

void Complete(OpState& state, std::string error) {
  {
    std::lock_guard lock(state.mu);
    state.done = true;
    state.error = std::move(error);
  }
  state.cv.notify_all();
}

// One posted SendAsync/RecvAsync: complete once none of its requests is left in MPI.
struct Transfer {
  P2pArgs args;
  std::shared_ptr<OpState> state;
  size_t left = 0;    // requests still in MPI
  std::string error;  // the first failure; later pieces only finish
};

// The point-to-point requests the comm thread has posted. Used by that thread only.
class PostedP2p {
 public:
  bool empty() const { return reqs_.empty(); }

  // Posts `a` in pieces. Every piece but the last is exactly kMaxChunk bytes and the last is
  // shorter (0 bytes when `bytes` is a multiple of it, 0 included): a receive whose size differs
  // from the send's then always meets a piece of the wrong size, which MPI reports (truncation or
  // a short count), instead of finishing early and leaving the rest to match the next message.
  // Returns the transfer when it is finished already (nothing could be posted).
  std::shared_ptr<Transfer> Post(const P2pArgs& a, std::shared_ptr<OpState> state) {
    auto t = std::make_shared<Transfer>();
    t->args = a;
    t->state = std::move(state);
    auto* p = static_cast<char*>(a.data);
    const size_t pieces = a.bytes / kMaxChunk + 1;
    for (size_t i = 0; i < pieces; ++i) {
      const size_t off = i * kMaxChunk;
      const int count = static_cast<int>(std::min(kMaxChunk, a.bytes - off));
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc =
          a.send ? MPI_Isend(p + off, count, MPI_BYTE, a.peer, kP2pTagBase + a.tag, a.comm, &req)
                 : MPI_Irecv(p + off, count, MPI_BYTE, a.peer, kP2pTagBase + a.tag, a.comm, &req);
      if (rc != MPI_SUCCESS) {
        Fail(*t, Describe(a) + ": " + MpiErrorString(rc));
        break;
      }
      reqs_.push_back(req);
      pieces_.push_back(Piece{t, off, count});
      ++t->left;
    }
    return t->left == 0 ? t : nullptr;
  }

  // Tests every posted request once; returns the transfers that finished.
  std::vector<std::shared_ptr<Transfer>> Poll() {
    std::vector<std::shared_ptr<Transfer>> finished;
    if (reqs_.empty()) return finished;
    indices_.resize(reqs_.size());
    statuses_.resize(reqs_.size());
    int n = 0;
    const int rc = MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &n, indices_.data(),
                                statuses_.data());
    if (rc == MPI_SUCCESS || rc == MPI_ERR_IN_STATUS) {
      for (int j = 0; j < n; ++j) {
        const size_t i = static_cast<size_t>(indices_[size_t(j)]);
        MPI_Status& st = statuses_[size_t(j)];
        // Statuses carry an error only with MPI_ERR_IN_STATUS.
        if (Done(i, st, rc == MPI_ERR_IN_STATUS ? st.MPI_ERROR : MPI_SUCCESS))
          finished.push_back(pieces_[i].t);
      }
    } else {
      // An error tied to no request (MPI itself is failing): give up on every transfer.
      const std::string err = "MPI_Testsome: " + MpiErrorString(rc);
      for (size_t i = 0; i < reqs_.size(); ++i) {
        if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);
        reqs_[i] = MPI_REQUEST_NULL;
        Transfer& t = *pieces_[i].t;
        if (t.error.empty()) t.error = Describe(t.args) + ": " + err;
        if (--t.left == 0) finished.push_back(pieces_[i].t);
      }
    }
    Compact();
    return finished;
  }

  // Fails every transfer still posted with `error` and forgets its requests (shutdown after the
  // engine gave up; the process is exiting without MPI_Finalize). Returns them.
  std::vector<std::shared_ptr<Transfer>> Abandon(const std::string& error) {
    std::vector<std::shared_ptr<Transfer>> out;
    for (Piece& pc : pieces_) {
      if (pc.t->left == 0) continue;
      pc.t->left = 0;
      pc.t->error = Describe(pc.t->args) + ": " + error;
      out.push_back(pc.t);
    }
    reqs_.clear();
    pieces_.clear();
    return out;
  }

 private:
  struct Piece {
    std::shared_ptr<Transfer> t;
    size_t offset = 0;
    int count = 0;
    bool cancelled = false;  // MPI_Cancel was called on it
  };

  static std::string Describe(const P2pArgs& a) {
    return std::string(a.send ? "SendAsync" : "RecvAsync") + " on rank " + std::to_string(a.rank) +
           (a.send ? " to rank " : " from rank ") + std::to_string(a.peer) + " (tag " +
           std::to_string(a.tag) + ", " + std::to_string(a.bytes) + " bytes)";
  }

  // Records piece i as complete with status `st` and error code `err`; true when that finishes
  // its transfer.
  bool Done(size_t i, MPI_Status& st, int err) {
    Piece& pc = pieces_[i];
    Transfer& t = *pc.t;
    // Open MPI leaves a request that failed allocated, for the caller to free.
    if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);
    reqs_[i] = MPI_REQUEST_NULL;
    if (t.error.empty()) {
      const P2pArgs& a = t.args;
      int cls = MPI_SUCCESS;
      if (err != MPI_SUCCESS) MPI_Error_class(err, &cls);
      if (!a.send && cls == MPI_ERR_TRUNCATE) {
        Fail(t, "RecvAsync on rank " + std::to_string(a.rank) + " from rank " +
                    std::to_string(a.peer) + " (tag " + std::to_string(a.tag) + "): expected " +
                    std::to_string(a.bytes) + " bytes, the sender sent more (" +
                    MpiErrorString(err) + ")");
      } else if (err != MPI_SUCCESS) {
        Fail(t, Describe(a) + ": " + MpiErrorString(err));
      } else if (!a.send && !pc.cancelled) {
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        // Only the sender's last piece is shorter than kMaxChunk, so this gives its full size.
        if (got != pc.count)
          Fail(t, "RecvAsync on rank " + std::to_string(a.rank) + " from rank " +
                      std::to_string(a.peer) + " (tag " + std::to_string(a.tag) + "): expected " +
                      std::to_string(a.bytes) + " bytes, the sender sent " +
                      std::to_string(pc.offset + size_t(got)));
      }
    }
    return --t.left == 0;
  }

  // Records `error` on t and cancels its receives still posted, so that the transfer finishes
  // (and MPI lets go of the buffer) instead of waiting for pieces that will not come. Sends are
  // left to finish: cancelling them is unreliable (deprecated in MPI 4).
  void Fail(Transfer& t, std::string error) {
    if (t.error.empty()) t.error = std::move(error);
    if (t.args.send) return;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (pieces_[k].t.get() != &t || pieces_[k].cancelled || reqs_[k] == MPI_REQUEST_NULL)
        continue;
      MPI_Cancel(&reqs_[k]);
      pieces_[k].cancelled = true;
    }
  }

  // Drops the completed requests, keeping the order of the rest.
  void Compact() {
    size_t w = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue;
      if (w != i) {
        reqs_[w] = reqs_[i];
        pieces_[w] = std::move(pieces_[i]);
      }
      ++w;
    }
    reqs_.resize(w);
    pieces_.resize(w);
  }

  std::vector<MPI_Request> reqs_;  // parallel to pieces_
  std::vector<Piece> pieces_;
  std::vector<int> indices_;  // scratch for MPI_Testsome
  std::vector<MPI_Status> statuses_;
};

}  // namespace

std::string MpiErrorString(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(msg, static_cast<size_t>(len));
}

int AwaitRequest(int post_rc, MPI_Request& req, MPI_Status* status) {
  if (post_rc != MPI_SUCCESS) return post_rc;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (;;) {
    int done = 0;
    if (int rc = MPI_Test(&req, &done, status); rc != MPI_SUCCESS || done) {
      // Open MPI leaves a request that failed allocated, for the caller to free.
      if (rc != MPI_SUCCESS && req != MPI_REQUEST_NULL) MPI_Request_free(&req);
      return rc;
    }
    if (Clock::now() - start >= kSpinFor) std::this_thread::sleep_for(kNap);
  }
}

std::shared_ptr<MpiEngine> MpiEngine::Acquire() {
  static std::mutex mu;
  static std::weak_ptr<MpiEngine> live;
  static bool used = false;
  std::lock_guard lock(mu);
  if (auto e = live.lock()) return e;
  if (used)
    ThrowRuntime("MPI was already finalized in this process: keep one MPI Comm alive for the run");
  std::shared_ptr<MpiEngine> e(new MpiEngine());  // throws if MPI does not come up
  used = true;
  live = e;
  return e;
}

MpiEngine::~MpiEngine() {
  std::unique_lock lock(queue_->mu);
  // Clean-ups do not count: a Split's communicator is often freed just before this, and counting
  // its free would send a normal exit down the grace path below, which skips MPI_Finalize if a
  // peer takes longer than the grace to get there.
  // Posted point-to-point ops count: they are in flight like a running one.
  const bool pending =
      queue_->busy || queue_->p2p_in_flight > 0 ||
      std::any_of(queue_->ops.begin(), queue_->ops.end(), [](const Op& op) { return !op.cleanup; });
  queue_->stop = true;
  queue_->cv.notify_all();
  auto exited = [&] { return queue_->exited; };
  if (!pending) {
    // A clean shutdown: MPI_Finalize waits for the other ranks to get there too.
    queue_->cv.wait(lock, exited);
  } else if (!queue_->cv.wait_for(lock, std::chrono::duration<double>(kShutdownGraceS), exited)) {
    // An operation is stuck in MPI (a lost or hung peer). Joining would hang the exit; instead
    // fail what has not started, leave the thread blocked, and skip MPI_Finalize. mpirun then
    // sees this rank exit unfinalized and ends the job, which the supervisor restarts. A thread
    // that is only polling posted point-to-point requests sees `abandoned`, fails them and exits.
    for (Op& op : queue_->ops) Complete(*op.state, "MPI communicator destroyed before this ran");
    queue_->ops.clear();
    queue_->p2p_queued = 0;
    queue_->abandoned = true;
    queue_->cv.notify_all();
    lock.unlock();
    Log("keel: MPI operation still in flight at shutdown after %.0f s; skipping MPI_Finalize",
        kShutdownGraceS);
    thread_.detach();
    return;
  }
  lock.unlock();
  thread_.join();
}

std::shared_ptr<OpState> MpiEngine::Submit(std::function<std::string()> run) {
  return Enqueue(Op{std::move(run), nullptr, /*cleanup=*/false, std::nullopt});
}

std::shared_ptr<OpState> MpiEngine::SubmitP2p(const P2pArgs& args) {
  auto state = std::make_shared<OpState>();
  {
    std::lock_guard lock(queue_->mu);
    KEEL_CHECK(!queue_->stop, "operation submitted to a communicator being destroyed");
    queue_->ops.insert(queue_->ops.begin() + std::ptrdiff_t(queue_->p2p_queued),
                       Op{nullptr, state, /*cleanup=*/false, args});
    ++queue_->p2p_queued;
  }
  queue_->cv.notify_all();
  return state;
}

void MpiEngine::Post(std::function<std::string()> run) {
  {
    std::lock_guard lock(queue_->mu);
    if (queue_->stop) return;
    queue_->ops.push_back(
        Op{std::move(run), std::make_shared<OpState>(), /*cleanup=*/true, std::nullopt});
  }
  queue_->cv.notify_all();
}

void MpiEngine::Run(std::function<std::string()> run, const std::string& group,
                    const std::string& op, uint64_t seq) {
  MpiWork work(Submit(std::move(run)), group, op, seq);
  WaitOrLostDefault(work);
}

std::shared_ptr<OpState> MpiEngine::Enqueue(Op op) {
  auto state = std::make_shared<OpState>();
  op.state = state;
  {
    std::lock_guard lock(queue_->mu);
    KEEL_CHECK(!queue_->stop, "operation submitted to a communicator being destroyed");
    queue_->ops.push_back(std::move(op));
  }
  queue_->cv.notify_all();
  return state;
}

MpiEngine::MpiEngine() : queue_(std::make_shared<Queue>()) {
  std::promise<std::string> started;
  auto started_future = started.get_future();
  // The promise moves into the thread: set_value may still be running when get() returns.
  thread_ =
      std::thread([this, q = queue_, started = std::move(started)]() mutable { Loop(q, started); });
  if (std::string err = started_future.get(); !err.empty()) {
    thread_.join();
    ThrowRuntime(err);
  }
}

// The comm thread. Initializes MPI, reports through `started`, then runs ops until stopped.
// It reaches the engine only before `started` is set (to store rank/size/comm); afterwards it
// touches just `q` and MPI, so that it can be detached safely.
void MpiEngine::Loop(std::shared_ptr<Queue> q, std::promise<std::string>& started) {
  int flag = 0;
  MPI_Finalized(&flag);
  if (flag) return started.set_value("MPI was already finalized in this process");
  MPI_Initialized(&flag);
  if (flag)
    return started.set_value(
        "MPI was initialized outside keel::parallel; keel's comm thread must own MPI");
  int provided = 0;
  if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      rc != MPI_SUCCESS)
    return started.set_value("MPI_Init_thread failed: " + MpiErrorString(rc));
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, f16_sum = MPI_OP_NULL;
  std::string err;
  if (provided < MPI_THREAD_SERIALIZED) {
    // Only this thread calls MPI, so FUNNELED would do in practice, but ask for what we use.
    err = "MPI_Init_thread: MPI_THREAD_SERIALIZED not supported (got level " +
          std::to_string(provided) + ")";
  } else if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm); rc != MPI_SUCCESS) {
    err = "MPI_Comm_dup: " + MpiErrorString(rc);
  } else {
    // Errors come back as codes that become keel::Error, instead of aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    comm_ = comm;
    int* tag_ub = nullptr;
    int has_tag_ub = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &has_tag_ub);
    tag_ub_ = has_tag_ub && tag_ub ? *tag_ub : 32767;  // 32767: the least MPI guarantees
    if (int rc = MPI_Op_create(&SumBf16, /*commute=*/1, &bf16_sum); rc != MPI_SUCCESS)
      err = "MPI_Op_create: " + MpiErrorString(rc);
    else if (int rc2 = MPI_Op_create(&SumF16, /*commute=*/1, &f16_sum); rc2 != MPI_SUCCESS)
      err = "MPI_Op_create: " + MpiErrorString(rc2);
    bf16_sum_ = bf16_sum;
    f16_sum_ = f16_sum;
  }
  if (!err.empty()) {
    MPI_Finalize();
    return started.set_value(err);
  }
  started.set_value("");  // from here on `this` may be gone (detached at shutdown)

  PostedP2p p2p;  // point-to-point requests in flight; this thread's alone
  // Completes finished point-to-point ops; called with q->mu held. Out of the in-flight count
  // before the caller hears, for the same reason as `busy` below.
  auto finish = [&](const std::vector<std::shared_ptr<Transfer>>& done) {
    for (const auto& t : done) {
      --q->p2p_in_flight;
      NoteDone(t->args.stream, t->args.seq);
      Complete(*t->state, std::move(t->error));
    }
  };
  std::unique_lock lock(q->mu);
  for (;;) {
    if (p2p.empty()) {
      q->cv.wait(lock, [&] { return q->stop || !q->ops.empty(); });
    } else {
      // Requests are posted: come back after a short sleep to test them (kP2pPollInterval says
      // why neither a blocking wait nor a spin). `stop` does not end the sleep: the posted
      // requests still have to finish before MPI_Finalize.
      q->cv.wait_for(lock, kP2pPollInterval, [&] { return q->abandoned || !q->ops.empty(); });
    }
    if (q->abandoned) {
      // ~MpiEngine gave up on this shutdown and skips MPI_Finalize; so does this thread.
      finish(p2p.Abandon("MPI communicator destroyed before the transfer completed"));
      return;
    }
    if (!q->ops.empty()) {
      Op op = std::move(q->ops.front());
      q->ops.pop_front();
      if (op.p2p) --q->p2p_queued;
      q->busy = !op.cleanup;
      lock.unlock();
      std::string error;
      std::vector<std::shared_ptr<Transfer>> done;
      if (op.p2p) {
        if (auto t = p2p.Post(*op.p2p, op.state)) done.push_back(std::move(t));
      } else {
        error = op.run();
      }
      // Also after a long collective: the requests progressed inside it.
      for (auto& t : p2p.Poll()) done.push_back(std::move(t));
      lock.lock();
      if (op.p2p) ++q->p2p_in_flight;  // in the same hold as busy = false: never seen idle
      // Not busy before the caller hears of completion: a caller that then destroys the last
      // Comm must not find this op still marked running and take the lost-peer path in
      // ~MpiEngine.
      q->busy = false;
      if (!op.p2p) Complete(*op.state, std::move(error));
      finish(done);
      continue;
    }
    if (p2p.empty()) {
      if (q->stop) break;  // stopped and drained
      continue;
    }
    lock.unlock();
    auto done = p2p.Poll();
    lock.lock();
    finish(done);
  }
  lock.unlock();
  MPI_Op_free(&bf16_sum);
  MPI_Op_free(&f16_sum);
  MPI_Comm_free(&comm);
  MPI_Finalize();
  lock.lock();
  q->exited = true;
  q->cv.notify_all();
}

}  // namespace keel::parallel
