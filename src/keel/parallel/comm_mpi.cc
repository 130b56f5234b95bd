// The OpenMPI communicator: every collective and transfer of parallel::Comm as an operation on the
// process's MPI engine (mpi_engine.h: one thread owns every MPI call, FIFO order).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "keel/core/collective_progress.h"
#include "keel/core/dtype.h"
#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/mpi_engine.h"

namespace keel::parallel {
namespace {

// Formats a failed MPI call for keel::Error; "" when rc is MPI_SUCCESS.
std::string Check(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return "";
  return std::string(call) + " failed on rank " + std::to_string(rank) + ": " + MpiErrorString(rc);
}

int ToCount(size_t n, const char* call) {
  if (n > static_cast<size_t>(INT_MAX))
    ThrowRuntime(std::string(call) + ": " + std::to_string(n) +
                 " elements per rank exceeds MPI's int count");
  return static_cast<int>(n);
}

// Allgatherv places each rank's piece at an int offset, so the offsets must fit too.
int ToDispl(size_t n, const char* call) {
  if (n > static_cast<size_t>(INT_MAX))
    ThrowRuntime(std::string(call) + ": offset of " + std::to_string(n) +
                 " elements exceeds MPI's int displacement");
  return static_cast<int>(n);
}

// Collectives over at least this many bytes run as MPI's blocking call, once an awaited barrier
// says that every rank has arrived; smaller ones as their nonblocking form, awaited
// (mpi_engine.h's AwaitRequest: a rank whose peer hangs naps instead of spinning). Not the
// nonblocking form always: on fewer than 4 ranks Open MPI's MPI_Iallreduce (libnbc) reduces an
// in-place buffer through one rank by a binomial tree, where the blocking call splits the work: a
// dp 2 step's gradient wait went from ~40 to ~120 ms. Not the blocking call always: it polls in a
// hot loop as long as a hung peer keeps it waiting; the barrier takes that wait, and the blocking
// call then runs with every rank there.
constexpr size_t kBlockingFromBytes = size_t{256} << 10;

template <class Post, class Block>
int Collective(MPI_Comm comm, size_t bytes, Post post, Block block) {
  MPI_Request req;
  if (bytes < kBlockingFromBytes) return AwaitRequest(post(&req), req);
  if (int rc = AwaitRequest(MPI_Ibarrier(comm, &req), req); rc != MPI_SUCCESS) return rc;
  return block();
}

MPI_Datatype MpiType(DType dtype) { return dtype == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

class MpiComm final : public Comm {
 public:
  explicit MpiComm(std::shared_ptr<MpiEngine> engine)
      : engine_(std::move(engine)),
        comm_(engine_->comm()),
        rank_(engine_->rank()),
        size_(engine_->size()) {}
  // A sub-communicator from Split; it owns `comm` and frees it when destroyed.
  MpiComm(std::shared_ptr<MpiEngine> engine, MPI_Comm comm, int rank, int size)
      : engine_(std::move(engine)), comm_(comm), rank_(rank), size_(size), owns_comm_(true) {}
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  ~MpiComm() override {
    if (!owns_comm_) return;  // the engine's own communicator, freed before MPI_Finalize
    // Through the queue, so that it runs after every operation issued on it. Not waited for: a
    // free that queues behind an operation stuck on a lost peer must not hang the exit.
    engine_->Post([comm = comm_, rank = rank_]() mutable -> std::string {
      if (int rc = MPI_Comm_free(&comm); rc != MPI_SUCCESS)
        Log("keel: %s", Check(rc, "MPI_Comm_free", rank).c_str());
      return "";
    });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  std::unique_ptr<Work> AllReduceSumAsync(float* data, size_t n) override {
    return AllReduceSumAsync(static_cast<void*>(data), n, DType::kF32);
  }

  std::unique_ptr<Work> ReduceScatterSumAsync(const float* send, float* recv, size_t n) override {
    KEEL_CHECK(n % static_cast<size_t>(size_) == 0, "ReduceScatter of " + std::to_string(n) +
                                                        " floats over " + std::to_string(size_) +
                                                        " ranks");
    int count = ToCount(n / static_cast<size_t>(size_), "MPI_Reduce_scatter_block");
    return Async("MPI_Reduce_scatter_block", [=, comm = comm_, rank = rank_] {
      return Check(
          Collective(
              comm, n * sizeof(float),
              [&](MPI_Request* r) {
                return MPI_Ireduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, comm, r);
              },
              [&] {
                return MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
              }),
          "MPI_Reduce_scatter_block", rank);
    });
  }

  std::unique_ptr<Work> AllGatherAsync(const float* send, float* recv, size_t n) override {
    int count = ToCount(n, "MPI_Allgather");
    // MPI forbids aliasing send and recv unless said with MPI_IN_PLACE; allow the common case
    // where this rank's piece already sits at its place in recv.
    const void* sendbuf = (send == recv + n * static_cast<size_t>(rank_)) ? MPI_IN_PLACE : send;
    const size_t bytes = n * size_t(size_) * sizeof(float);
    return Async("MPI_Allgather", [=, comm = comm_, rank = rank_] {
      return Check(
          Collective(
              comm, bytes,
              [&](MPI_Request* r) {
                return MPI_Iallgather(sendbuf, count, MPI_FLOAT, recv, count, MPI_FLOAT, comm, r);
              },
              [&] {
                return MPI_Allgather(sendbuf, count, MPI_FLOAT, recv, count, MPI_FLOAT, comm);
              }),
          "MPI_Allgather", rank);
    });
  }

  std::unique_ptr<Work> AllReduceSumAsync(void* data, size_t n, DType dtype) override {
    const MPI_Datatype type = MpiType(dtype);
    const MPI_Op op = SumOp(dtype);
    const size_t elem = DTypeSize(dtype);
    return Async("MPI_Allreduce", [=, comm = comm_, rank = rank_]() -> std::string {
      auto* p = static_cast<char*>(data);
      for (size_t off = 0; off < n; off += kMaxChunk) {
        int count = static_cast<int>(std::min(kMaxChunk, n - off));
        void* buf = p + off * elem;
        int rc = Collective(
            comm, size_t(count) * elem,
            [&](MPI_Request* r) {
              return MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, r);
            },
            [&] { return MPI_Allreduce(MPI_IN_PLACE, buf, count, type, op, comm); });
        if (rc != MPI_SUCCESS) return Check(rc, "MPI_Allreduce", rank);
      }
      return "";
    });
  }

  std::unique_ptr<Work> ReduceScatterSumAsync(const void* send, void* recv,
                                              const std::vector<size_t>& counts,
                                              DType dtype) override {
    KEEL_CHECK(counts.size() == static_cast<size_t>(size_),
               "ReduceScatter with " + std::to_string(counts.size()) + " counts over " +
                   std::to_string(size_) + " ranks");
    // Converted now, so that a count too large for MPI throws on the caller's thread; and copied,
    // since the caller's vector may be gone before the op runs.
    std::vector<int> recvcounts(counts.size());
    for (size_t q = 0; q < counts.size(); ++q)
      recvcounts[q] = ToCount(counts[q], "MPI_Reduce_scatter");
    const MPI_Datatype type = MpiType(dtype);
    const MPI_Op op = SumOp(dtype);
    // In place (send == recv): MPI takes the input from recv and leaves this rank's part at its
    // start, which saves the caller a receive buffer as large as the input.
    const void* sendbuf = send == recv ? MPI_IN_PLACE : send;
    size_t total = 0;
    for (size_t c : counts) total += c;
    const size_t bytes = total * DTypeSize(dtype);
    return Async("MPI_Reduce_scatter", [=, recvcounts = std::move(recvcounts), comm = comm_,
                                        rank = rank_] {
      return Check(
          Collective(
              comm, bytes,
              [&](MPI_Request* r) {
                return MPI_Ireduce_scatter(sendbuf, recv, recvcounts.data(), type, op, comm, r);
              },
              [&] { return MPI_Reduce_scatter(sendbuf, recv, recvcounts.data(), type, op, comm); }),
          "MPI_Reduce_scatter", rank);
    });
  }

  std::unique_ptr<Work> AllGatherAsync(const void* send, void* recv,
                                       const std::vector<size_t>& counts, DType dtype) override {
    KEEL_CHECK(counts.size() == static_cast<size_t>(size_),
               "AllGather with " + std::to_string(counts.size()) + " counts over " +
                   std::to_string(size_) + " ranks");
    std::vector<int> recvcounts(counts.size()), displs(counts.size());
    size_t off = 0;
    for (size_t q = 0; q < counts.size(); ++q) {
      recvcounts[q] = ToCount(counts[q], "MPI_Allgatherv");
      displs[q] = ToDispl(off, "MPI_Allgatherv");
      off += counts[q];
    }
    const MPI_Datatype type = MpiType(dtype);
    const int sendcount = recvcounts[static_cast<size_t>(rank_)];
    // As in the float version: in place when this rank's piece already sits at its place in recv.
    const char* mine =
        static_cast<const char*>(recv) + size_t(displs[size_t(rank_)]) * DTypeSize(dtype);
    const void* sendbuf = send == mine ? MPI_IN_PLACE : send;
    const size_t bytes = off * DTypeSize(dtype);
    return Async("MPI_Allgatherv", [=, recvcounts = std::move(recvcounts),
                                    displs = std::move(displs), comm = comm_, rank = rank_] {
      return Check(Collective(
                       comm, bytes,
                       [&](MPI_Request* r) {
                         return MPI_Iallgatherv(sendbuf, sendcount, type, recv, recvcounts.data(),
                                                displs.data(), type, comm, r);
                       },
                       [&] {
                         return MPI_Allgatherv(sendbuf, sendcount, type, recv, recvcounts.data(),
                                               displs.data(), type, comm);
                       }),
                   "MPI_Allgatherv", rank);
    });
  }

  std::unique_ptr<Work> AllToAllAsync(const void* send, void* recv,
                                      const std::vector<size_t>& counts) override {
    KEEL_CHECK(counts.size() == static_cast<size_t>(size_),
               "AllToAll with " + std::to_string(counts.size()) + " counts over " +
                   std::to_string(size_) + " ranks");
    std::vector<int> sendcounts(counts.size()), sdispls(counts.size()), recvcounts(counts.size()),
        rdispls(counts.size());
    size_t off = 0;
    const size_t mine = counts[size_t(rank_)];
    for (size_t q = 0; q < counts.size(); ++q) {
      sendcounts[q] = ToCount(counts[q], "MPI_Alltoallv");
      sdispls[q] = ToDispl(off, "MPI_Alltoallv");
      recvcounts[q] = ToCount(mine, "MPI_Alltoallv");
      rdispls[q] = ToDispl(q * mine, "MPI_Alltoallv");
      off += counts[q];
    }
    // The same on every rank (Collective picks its path by it, and every rank must pick alike).
    const size_t bytes = off;
    return Async("MPI_Alltoallv", [=, sendcounts = std::move(sendcounts),
                                   sdispls = std::move(sdispls), recvcounts = std::move(recvcounts),
                                   rdispls = std::move(rdispls), comm = comm_, rank = rank_] {
      return Check(
          Collective(
              comm, bytes,
              [&](MPI_Request* r) {
                return MPI_Ialltoallv(send, sendcounts.data(), sdispls.data(), MPI_BYTE, recv,
                                      recvcounts.data(), rdispls.data(), MPI_BYTE, comm, r);
              },
              [&] {
                return MPI_Alltoallv(send, sendcounts.data(), sdispls.data(), MPI_BYTE, recv,
                                     recvcounts.data(), rdispls.data(), MPI_BYTE, comm);
              }),
          "MPI_Alltoallv", rank);
    });
  }

  std::unique_ptr<Work> ThenAsync(std::function<std::string()> fn) override {
    // Not tracked in the group's progress: it is local work, which no peer waits for.
    return std::make_unique<MpiWork>(engine_->Submit(std::move(fn)), label(), "local work");
  }

  std::unique_ptr<Comm> Split(int color, int key) override {
    // MPI would turn a negative color (MPI_UNDEFINED) into MPI_COMM_NULL, which no Comm can wrap.
    KEEL_CHECK(color >= 0, "Split with negative color " + std::to_string(color));
    MPI_Comm sub = MPI_COMM_NULL;
    int sub_rank = -1, sub_size = 0;
    // The op writes to these locals, so this wait has no deadline: it returns only after the op
    // has run (a lost peer at setup is the watchdog's).
    MpiWork split(engine_->Submit([&, comm = comm_, rank = rank_]() -> std::string {
      if (int rc = MPI_Comm_split(comm, color, key, &sub); rc != MPI_SUCCESS)
        return Check(rc, "MPI_Comm_split", rank);
      MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
      MPI_Comm_rank(sub, &sub_rank);
      MPI_Comm_size(sub, &sub_size);
      return "";
    }));
    KEEL_CHECK(split.Wait(-1), "Wait without a timeout returned false");
    return std::make_unique<MpiComm>(engine_, sub, sub_rank, sub_size);
  }

  void Broadcast(void* data, size_t bytes, int root) override {
    Blocking("MPI_Bcast", [=, comm = comm_, rank = rank_]() -> std::string {
      auto* p = static_cast<char*>(data);
      for (size_t off = 0; off < bytes; off += kMaxChunk) {
        int count = static_cast<int>(std::min(kMaxChunk, bytes - off));
        if (int rc = Collective(
                comm, size_t(count),
                [&](MPI_Request* r) { return MPI_Ibcast(p + off, count, MPI_BYTE, root, comm, r); },
                [&] { return MPI_Bcast(p + off, count, MPI_BYTE, root, comm); });
            rc != MPI_SUCCESS)
          return Check(rc, "MPI_Bcast", rank);
      }
      return "";
    });
  }

  void Send(const void* data, size_t bytes, int peer) override {
    Blocking("MPI_Send to rank " + std::to_string(peer),
             [=, comm = comm_, rank = rank_]() -> std::string {
               const auto* p = static_cast<const char*>(data);
               // Both sides cut a message into the same chunks, so they match one to one.
               for (size_t off = 0; off == 0 || off < bytes; off += kMaxChunk) {
                 int count = static_cast<int>(std::min(kMaxChunk, bytes - off));
                 MPI_Request req;
                 if (int rc = AwaitRequest(
                         MPI_Isend(p + off, count, MPI_BYTE, peer, kTag, comm, &req), req);
                     rc != MPI_SUCCESS)
                   return Check(rc, "MPI_Send", rank);
               }
               return "";
             });
  }

  void Recv(void* data, size_t bytes, int peer) override {
    Blocking("MPI_Recv from rank " + std::to_string(peer),
             [=, comm = comm_, rank = rank_]() -> std::string {
               auto* p = static_cast<char*>(data);
               for (size_t off = 0; off == 0 || off < bytes; off += kMaxChunk) {
                 int count = static_cast<int>(std::min(kMaxChunk, bytes - off));
                 MPI_Status status;
                 MPI_Request req;
                 if (int rc = AwaitRequest(
                         MPI_Irecv(p + off, count, MPI_BYTE, peer, kTag, comm, &req), req, &status);
                     rc != MPI_SUCCESS)
                   return Check(rc, "MPI_Recv", rank);
                 int got = 0;
                 MPI_Get_count(&status, MPI_BYTE, &got);
                 if (got != count)
                   return "MPI_Recv on rank " + std::to_string(rank) + " from rank " +
                          std::to_string(peer) + ": expected " + std::to_string(bytes) +
                          " bytes, the sender sent fewer";
               }
               return "";
             });
  }

  std::unique_ptr<Work> SendAsync(const void* data, size_t bytes, int peer, int tag) override {
    // MPI_Isend only reads the buffer; the const_cast is for P2pArgs, shared with receives.
    return P2p(/*send=*/true, const_cast<void*>(data), bytes, peer, tag);
  }

  std::unique_ptr<Work> RecvAsync(void* data, size_t bytes, int peer, int tag) override {
    return P2p(/*send=*/false, data, bytes, peer, tag);
  }

  void Barrier() override {
    Blocking("MPI_Barrier", [comm = comm_, rank = rank_] {
      MPI_Request req;
      return Check(AwaitRequest(MPI_Ibarrier(comm, &req), req), "MPI_Barrier", rank);
    });
  }

 protected:
  void AllReduceDoubles(double* data, size_t n, bool max) override {
    int count = ToCount(n, "MPI_Allreduce");
    Blocking("MPI_Allreduce", [=, comm = comm_, rank = rank_] {
      MPI_Request req;
      return Check(AwaitRequest(MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE,
                                               max ? MPI_MAX : MPI_SUM, comm, &req),
                                req),
                   "MPI_Allreduce", rank);
    });
  }

 private:
  static constexpr int kTag = 0;  // one stream per pair; MPI keeps it in order

  // A collective on the engine, counted in this group's progress (core/collective_progress.h)
  // when issued and when it returns.
  std::function<std::string()> Tracked(const std::string& op, std::function<std::string()> run,
                                       uint64_t* seq_out = nullptr) {
    const uint64_t seq = NoteIssued(label(), op);
    if (seq_out) *seq_out = seq;
    return [group = label(), seq, run = std::move(run)] {
      std::string error = run();
      NoteDone(group, seq);
      return error;
    };
  }
  std::unique_ptr<Work> Async(const std::string& op, std::function<std::string()> run) {
    uint64_t seq = 0;
    std::function<std::string()> tracked = Tracked(op, std::move(run), &seq);
    return std::make_unique<MpiWork>(engine_->Submit(std::move(tracked)), label(), op, seq);
  }
  // Waits up to the default deadline (comm_wait.h): past it, exit 75 naming the group, the
  // operation and its sequence number.
  void Blocking(const std::string& op, std::function<std::string()> run) {
    uint64_t seq = 0;
    std::function<std::string()> tracked = Tracked(op, std::move(run), &seq);
    engine_->Run(std::move(tracked), label(), op, seq);
  }

  // A bad peer is left to MPI (Wait throws its error, as for Send); a bad tag could silently
  // collide with the blocking Send/Recv's, so it throws here.
  std::unique_ptr<Work> P2p(bool send, void* data, size_t bytes, int peer, int tag) {
    const int max_tag = engine_->tag_ub() - kP2pTagBase;
    KEEL_CHECK(tag >= 0 && tag <= max_tag, std::string(send ? "SendAsync" : "RecvAsync") +
                                               " with tag " + std::to_string(tag) +
                                               ", outside 0.." + std::to_string(max_tag));
    P2pArgs args;
    args.send = send;
    args.data = data;
    args.bytes = bytes;
    args.peer = peer;
    args.tag = tag;
    args.comm = comm_;
    args.rank = rank_;
    const int from = send ? rank_ : peer, to = send ? peer : rank_;
    args.stream = label() + " " + std::to_string(from) + "->" + std::to_string(to) + " tag " +
                  std::to_string(tag);
    const char* op = send ? "SendAsync" : "RecvAsync";
    args.seq = NoteIssued(args.stream, op);
    return std::make_unique<MpiWork>(engine_->SubmitP2p(args), args.stream, op, args.seq);
  }

  MPI_Op SumOp(DType dtype) const {
    return dtype == DType::kF32   ? MPI_SUM
           : dtype == DType::kF16 ? engine_->f16_sum()
                                  : engine_->bf16_sum();
  }

  std::shared_ptr<MpiEngine> engine_;  // keeps MPI up while this Comm lives
  MPI_Comm comm_;
  int rank_;
  int size_;
  bool owns_comm_ = false;  // a Split's communicator, not the engine's
};

}  // namespace

std::unique_ptr<Comm> MakeMpiComm() {
  auto comm = std::make_unique<MpiComm>(MpiEngine::Acquire());
  SetLogRank(comm->size() > 1 ? comm->rank() : -1);
  return comm;
}

std::string MpiLibraryVersion() {
  // Callable before MPI_Init (MPI 3.0), so preflight can compare it before starting MPI.
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "unknown";
  std::string v(buf, size_t(len));
  const size_t nl = v.find_first_of("\n,");
  return nl == std::string::npos ? v : v.substr(0, nl);
}

}  // namespace keel::parallel
