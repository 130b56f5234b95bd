// The communicator seam: every collective keel uses, behind one interface, so that the trainer
// does not know whether it runs alone, over MPI, or (later) over NCCL.
//
// Asynchronous operations return a handle; the caller may overlap compute and then Wait. A Wait
// with a timeout returns false when the deadline passes (a hang or a lost peer; the caller turns
// that into exit code 75, keel::ExitCode::kTempFail, so that the supervisor restarts the run).
//
// Every rank must issue the collectives of one communicator in the same order (MPI's rule).
// Operations, blocking ones included, run one at a time in issue order, so they also complete in
// issue order; the exception is SendAsync/RecvAsync, which are posted ahead of queued collectives
// (in their own issue order) and complete when their transfer does, possibly after later
// operations. Blocking operations wait without a deadline; hangs there are the watchdog's job.
//
//   auto comm = keel::parallel::CreateComm();          // MPI under mpirun, local otherwise
//   auto h = comm->AllReduceSumAsync(grads, n);    // starts now, runs beside backward
//   ...
//   if (!h->Wait(/*timeout_s=*/300)) throw ...;
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "keel/core/dtype.h"

namespace keel::parallel {

class Work {
 public:
  virtual ~Work() = default;
  // True once the operation has completed; false if timeout_s passed first (the operation is
  // then still in flight). A negative timeout waits forever. Throws keel::Error if the operation
  // failed (e.g. an MPI error, whose message it carries).
  [[nodiscard]] virtual bool Wait(double timeout_s = -1) = 0;
  // What the operation is in progress reports, for the message of a wait that times out: its
  // group, operation and sequence number ("tp#0 MPI_Allreduce #231"; for a pipeline transfer its
  // stream, "pp#0 0->1 tag 10 RecvAsync #5"); "" if the communicator does not count them.
  virtual std::string describe() const { return ""; }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "local", "mpi"
  // The group's name in progress reports (core/collective_progress.h), the same on every rank of
  // the group: "world" unless MakeGroups named it ("dp#0": the data-parallel group of color 0).
  const std::string& label() const { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }

  // In-place sum over all ranks. The buffer must stay alive and untouched until Wait returns true.
  // Operations complete in the order they were issued.
  virtual std::unique_ptr<Work> AllReduceSumAsync(float* data, size_t n) = 0;
  // recv (n/size floats) = this rank's slice of the sum of send (n floats); n % size == 0.
  virtual std::unique_ptr<Work> ReduceScatterSumAsync(const float* send, float* recv, size_t n) = 0;
  // recv (n·size floats) = concatenation of every rank's send (n floats), in rank order.
  virtual std::unique_ptr<Work> AllGatherAsync(const float* send, float* recv, size_t n) = 0;

  // The same collectives on fp32 or bf16 (bf16 sums are taken in fp32 per pair and rounded to
  // nearest even, as NCCL does). `data`, `send` and `recv` point to elements of `dtype`.
  virtual std::unique_ptr<Work> AllReduceSumAsync(void* data, size_t n, DType dtype) = 0;
  // Variable counts: rank r receives counts[r] elements, the slice of the sum of `send`
  // (Σ counts elements) that starts at counts[0] + ... + counts[r-1]. A count may be 0. In place
  // when send == recv: the input is read from recv and the result left at its start.
  virtual std::unique_ptr<Work> ReduceScatterSumAsync(const void* send, void* recv,
                                                      const std::vector<size_t>& counts,
                                                      DType dtype) = 0;
  // Variable counts: rank r contributes counts[r] elements of `send`; recv (Σ counts elements)
  // holds every rank's, in rank order. `send` may be this rank's place in `recv` (in place).
  virtual std::unique_ptr<Work> AllGatherAsync(const void* send, void* recv,
                                               const std::vector<size_t>& counts, DType dtype) = 0;

  // Every rank sends counts[r] bytes to rank r (its pieces in rank order in `send`) and receives
  // counts[rank()] bytes from each rank, in rank order, into `recv` (size() · counts[rank()]
  // bytes): the exchange that a reduce-scatter in a compressed format is made of (wire_reduce.h).
  virtual std::unique_ptr<Work> AllToAllAsync(const void* send, void* recv,
                                              const std::vector<size_t>& counts) = 0;
  // Runs `fn` after every operation issued before it and before any issued after, on the thread
  // that runs them (the local communicator: at once, on the caller's), so that the work between
  // two phases of a composite collective (decoding a received piece, encoding the next) does not
  // wait for the caller. `fn` returns "" or an error message, which Wait throws. Not a collective:
  // it involves no other rank. Host buffers only.
  virtual std::unique_ptr<Work> ThenAsync(std::function<std::string()> fn) = 0;

  // A communicator over the ranks that passed the same `color`, ordered by `key` (then by rank),
  // as MPI_Comm_split. Collective over this communicator: every rank calls it, in the same order
  // as its other operations. The result shares this one's engine (one FIFO per process): ranks
  // must issue the operations of all their groups in one consistent order.
  virtual std::unique_ptr<Comm> Split(int color, int key) = 0;

  virtual void Broadcast(void* data, size_t bytes, int root) = 0;
  virtual void Send(const void* data, size_t bytes, int peer) = 0;
  virtual void Recv(void* data, size_t bytes, int peer) = 0;
  // Point-to-point, asynchronous (pipeline stages): posted on the engine in issue order, ahead of
  // collectives still queued (a pipeline's transfers do not wait behind gradient buckets), and
  // completed by MPI's progress while the caller computes, so two ranks may each send to the other
  // before either receives without deadlock. Messages between two ranks match by tag in issue
  // order. The buffer must stay alive and untouched until Wait returns true.
  // Tags are the caller's: 0..32766 work everywhere (MPI guarantees tags up to 32767 and keel
  // keeps one), and these messages never match the blocking Send/Recv's. A receive whose `bytes`
  // differ from the matching send's fails: Wait throws keel::Error naming both sizes.
  virtual std::unique_ptr<Work> SendAsync(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> RecvAsync(void* data, size_t bytes, int peer, int tag) = 0;
  virtual void Barrier() = 0;

  // Blocking conveniences.
  void AllReduceSum(float* data, size_t n);
  double AllReduceSum(double x);              // a scalar, e.g. a loss or a squared norm
  void AllReduceSum(double* data, size_t n);  // elementwise
  double AllReduceMax(double x);
  void AllReduceMax(double* data, size_t n);       // elementwise, e.g. several flags in one call
  void BroadcastString(std::string& s, int root);  // root's text, resized on the others

 protected:
  virtual void AllReduceDoubles(double* data, size_t n, bool max) = 0;

 private:
  std::string label_ = "world";
};

std::unique_ptr<Comm> MakeLocalComm();
// Initializes MPI on a dedicated communication thread (once per process) and shares it between the
// MPI Comms alive; MPI is finalized when the last one is destroyed, after which no new one can be
// made (MPI cannot restart). Throws keel::Error if MPI fails.
std::unique_ptr<Comm> MakeMpiComm();
// MPI when the process was started by mpirun/srun (size > 1 in the environment), local otherwise.
// The environment variable KEEL_COMM=local|mpi overrides the choice.
std::unique_ptr<Comm> CreateComm();
// NCCL over the ranks of `bootstrap` (which must outlive it): device buffers through NCCL, host
// buffers through `bootstrap`. Collective over `bootstrap`. Loads the plugin libkeel_nccl.so
// (core/plugin.h); throws BadInput where it is missing or cannot load (NcclBuilt() false: keel was
// built without CUDA).
std::unique_ptr<Comm> MakeNcclComm(Comm& bootstrap);
bool NcclBuilt();

// The MPI library's own version line, e.g. "Open MPI v4.1.4" (for preflight's consistency check).
std::string MpiLibraryVersion();

}  // namespace keel::parallel
