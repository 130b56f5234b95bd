// NCCL as a Comm (built with the CUDA backend): collectives and point-to-point transfers on device
// buffers go through NCCL on a stream of their own; host buffers (a loss, a hash, a flag) go to the
// group's MPI communicator, which also bootstraps NCCL (the unique id is broadcast over it) and
// splits groups. A collective waits for the kernels already issued on the compute stream (an
// event), and its Work polls an event recorded after it, so Wait(timeout) keeps its meaning:
// false when the peers have not answered in time (parallel::WaitOrLost then exits 75).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

namespace keel::parallel {
namespace {

void Check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) ThrowRuntime(std::string("NCCL: ") + what + ": " + ncclGetErrorString(r));
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) ThrowRuntime(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define KEEL_NCCL(call) Check((call), #call)

ncclDataType_t TypeOf(DType t) { return t == DType::kF32 ? ncclFloat32 : ncclBfloat16; }

bool OnDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // a plain host pointer on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, ncclComm_t comm) : done_(done), comm_(comm) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  bool Wait(double timeout_s) override {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) Check(e, "waiting for a collective");
      ncclResult_t async = ncclSuccess;
      KEEL_NCCL(ncclCommGetAsyncError(comm_, &async));
      KEEL_NCCL(async);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s >= 0 && waited > timeout_s) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  cudaEvent_t done_;
  ncclComm_t comm_;
};

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& boot, std::unique_ptr<Comm> owned) : boot_(boot), owned_(std::move(owned)) {
    ncclUniqueId id{};
    if (boot.rank() == 0) KEEL_NCCL(ncclGetUniqueId(&id));
    boot.Broadcast(&id, sizeof id, 0);
    KEEL_NCCL(ncclCommInitRank(&comm_, boot.size(), id, boot.rank()));
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    set_label(boot.label());
  }
  ~NcclComm() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
  }

  int rank() const override { return boot_.rank(); }
  int size() const override { return boot_.size(); }
  const char* name() const override { return "nccl"; }

  std::unique_ptr<Work> AllReduceSumAsync(float* data, size_t n) override {
    return AllReduceSumAsync(data, n, DType::kF32);
  }
  std::unique_ptr<Work> ReduceScatterSumAsync(const float* send, float* recv, size_t n) override {
    return ReduceScatterSumAsync(send, recv, std::vector<size_t>(size_t(size()), n / size()),
                                 DType::kF32);
  }
  std::unique_ptr<Work> AllGatherAsync(const float* send, float* recv, size_t n) override {
    return AllGatherAsync(send, recv, std::vector<size_t>(size_t(size()), n), DType::kF32);
  }

  std::unique_ptr<Work> AllReduceSumAsync(void* data, size_t n, DType dtype) override {
    if (!OnDevice(data)) return boot_.AllReduceSumAsync(data, n, dtype);
    Begin();
    KEEL_NCCL(ncclAllReduce(data, data, n, TypeOf(dtype), ncclSum, comm_, stream_));
    return End();
  }
  // NCCL's reduce-scatter takes equal counts: one reduce per root instead, grouped, into scratch
  // (in place, a root's output would overlap another root's input).
  std::unique_ptr<Work> ReduceScatterSumAsync(const void* send, void* recv,
                                              const std::vector<size_t>& counts,
                                              DType dtype) override {
    if (!OnDevice(recv)) return boot_.ReduceScatterSumAsync(send, recv, counts, dtype);
    const size_t es = DTypeSize(dtype), mine = counts[size_t(rank())];
    void* tmp = Scratch(mine * es);
    Begin();
    KEEL_NCCL(ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t n = counts[size_t(r)];
      if (n)
        KEEL_NCCL(ncclReduce(static_cast<const char*>(send) + off * es, tmp, n, TypeOf(dtype),
                             ncclSum, r, comm_, stream_));
      off += n;
    }
    KEEL_NCCL(ncclGroupEnd());
    if (mine)
      Check(cudaMemcpyAsync(recv, tmp, mine * es, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
    return End();
  }
  std::unique_ptr<Work> AllGatherAsync(const void* send, void* recv,
                                       const std::vector<size_t>& counts, DType dtype) override {
    if (!OnDevice(recv)) return boot_.AllGatherAsync(send, recv, counts, dtype);
    const size_t es = DTypeSize(dtype);
    Begin();
    KEEL_NCCL(ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t n = counts[size_t(r)];
      if (n)
        KEEL_NCCL(ncclBroadcast(r == rank() ? send : nullptr, static_cast<char*>(recv) + off * es,
                                n, TypeOf(dtype), r, comm_, stream_));
      off += n;
    }
    KEEL_NCCL(ncclGroupEnd());
    return End();
  }

  std::unique_ptr<Comm> Split(int color, int key) override {
    std::unique_ptr<Comm> sub = boot_.Split(color, key);
    Comm& ref = *sub;
    return std::make_unique<NcclComm>(ref, std::move(sub));
  }

  void Broadcast(void* data, size_t bytes, int root) override {
    if (!OnDevice(data)) return boot_.Broadcast(data, bytes, root);
    Begin();
    KEEL_NCCL(ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_));
    (void)End()->Wait(-1);
  }
  void Send(const void* data, size_t bytes, int peer) override {
    (void)SendAsync(data, bytes, peer, 0)->Wait(-1);
  }
  void Recv(void* data, size_t bytes, int peer) override {
    (void)RecvAsync(data, bytes, peer, 0)->Wait(-1);
  }
  // NCCL has no tags: transfers between two ranks match in issue order, which the pipeline keeps.
  std::unique_ptr<Work> SendAsync(const void* data, size_t bytes, int peer, int tag) override {
    if (!OnDevice(data)) return boot_.SendAsync(data, bytes, peer, tag);
    Begin();
    KEEL_NCCL(ncclSend(data, bytes, ncclChar, peer, comm_, stream_));
    return End();
  }
  std::unique_ptr<Work> RecvAsync(void* data, size_t bytes, int peer, int tag) override {
    if (!OnDevice(data)) return boot_.RecvAsync(data, bytes, peer, tag);
    Begin();
    KEEL_NCCL(ncclRecv(data, bytes, ncclChar, peer, comm_, stream_));
    return End();
  }
  void Barrier() override { boot_.Barrier(); }

 protected:
  void AllReduceDoubles(double* data, size_t n, bool max) override {
    if (max)
      boot_.AllReduceMax(data, n);
    else
      boot_.AllReduceSum(data, n);
  }

 private:
  // The collective's stream waits for the compute stream's kernels issued so far.
  void Begin() {
    cudaEvent_t ready;
    Check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(ready, 0), "cudaEventRecord");
    Check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
  }
  std::unique_ptr<Work> End() {
    cudaEvent_t done;
    Check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(done, stream_), "cudaEventRecord");
    return std::make_unique<NcclWork>(done, comm_);
  }
  void* Scratch(size_t bytes) {
    if (scratch_bytes_ < bytes) {
      Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      if (scratch_) cudaFree(scratch_);
      Check(cudaMalloc(&scratch_, bytes), "cudaMalloc");
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  Comm& boot_;
  std::unique_ptr<Comm> owned_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Comm> MakeNcclComm(Comm& bootstrap) {
  return std::make_unique<NcclComm>(bootstrap, nullptr);
}

}  // namespace keel::parallel
