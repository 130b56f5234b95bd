// NCCL as a Comm (built with the CUDA backend): collectives on device buffers go through NCCL on
// a stream of their own; host buffers (a loss, a hash, a flag) go to the group's MPI
// communicator, which also bootstraps NCCL (the unique id is broadcast over it) and splits
// groups. A collective waits for the kernels already issued on the compute stream (an event), and
// its Work polls an event recorded after it, so Wait(timeout) keeps its meaning: false when the
// peers have not answered in time, and the communicator is aborted then, so that its kernels end
// and the process can exit 75 (parallel::WaitOrLost) instead of hanging in teardown.
// Point-to-point transfers of device buffers (pipeline stages) go through host memory and MPI's
// tagged messages: Comm's contract matches messages by tag and lets posted receives wait while
// later sends go out, which NCCL's in-order streams do not (3+ stages, interleaved schedules).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

namespace keel::parallel {
namespace {

// The CUDA backend's compute stream (kernels/cuda/backend_cuda.cu), on which the kernels a
// collective waits for were issued: the legacy default stream, which the synchronous cudaMemcpy
// calls below also use. Named here because parallel/ does not include kernels/.
constexpr cudaStream_t kComputeStream = nullptr;

void Check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) ThrowRuntime(std::string("NCCL: ") + what + ": " + ncclGetErrorString(r));
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) ThrowRuntime(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define KEEL_NCCL(call) Check((call), #call)

ncclDataType_t TypeOf(DType t) {
  return t == DType::kF32 ? ncclFloat32 : t == DType::kF16 ? ncclFloat16 : ncclBfloat16;
}

bool OnDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // a plain host pointer on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The communicator and whether it was aborted, shared by the comm and its pending work.
// `comm` is null once the comm is gone: work that outlives it reads as aborted.
struct NcclState {
  ncclComm_t comm = nullptr;
  bool aborted = false;
  void Abort() {
    if (!aborted && comm) ncclCommAbort(comm);
    aborted = true;
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, std::shared_ptr<NcclState> state)
      : done_(done), state_(std::move(state)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  bool Wait(double timeout_s) override {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (state_->aborted || !state_->comm) return false;
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) Check(e, "waiting for a collective");
      ncclResult_t async = ncclSuccess;
      KEEL_NCCL(ncclCommGetAsyncError(state_->comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        state_->Abort();
        KEEL_NCCL(async);
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s >= 0 && waited > timeout_s) {
        state_->Abort();  // a peer is lost: end the kernels waiting for it
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  cudaEvent_t done_;
  std::shared_ptr<NcclState> state_;
};

// A transfer staged through host memory: a send copies out before posting, a receive copies in
// once MPI has delivered.
class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, std::vector<char> host, void* device_dst)
      : inner_(std::move(inner)), host_(std::move(host)), dst_(device_dst) {}
  // Not finished (a lost peer; the process is on its way to exit 75): MPI may still write into
  // the staging buffer, which is leaked on purpose rather than freed under it.
  ~StagedWork() override {
    if (!done_) new std::vector<char>(std::move(host_));
  }
  bool Wait(double timeout_s) override {
    if (done_) return true;
    if (!inner_->Wait(timeout_s)) return false;
    if (dst_)
      Check(cudaMemcpy(dst_, host_.data(), host_.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    done_ = true;
    return true;
  }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<Work> inner_;
  std::vector<char> host_;
  void* dst_;
  bool done_ = false;
};

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& boot, std::unique_ptr<Comm> owned)
      : boot_(boot), owned_(std::move(owned)), state_(std::make_shared<NcclState>()) {
    ncclUniqueId id{};
    if (boot.rank() == 0) KEEL_NCCL(ncclGetUniqueId(&id));
    boot.Broadcast(&id, sizeof id, 0);
    KEEL_NCCL(ncclCommInitRank(&state_->comm, boot.size(), id, boot.rank()));
    comm_ = state_->comm;
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    set_label(boot.label());
  }
  // Waits up to kTeardownS for the comm's work; past that (a peer lost while another group
  // timed out) aborts rather than hangs.
  ~NcclComm() override {
    constexpr double kTeardownS = 60;
    if (!state_->aborted) {
      cudaEvent_t done;
      if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess &&
          cudaEventRecord(done, stream_) == cudaSuccess) {
        NcclWork w(done, state_);
        if (w.Wait(kTeardownS)) ncclCommDestroy(comm_);
      } else {
        state_->Abort();
      }
    }
    state_->comm = nullptr;
    state_->aborted = true;
    if (scratch_) cudaFreeAsync(scratch_, stream_);
    cudaStreamDestroy(stream_);
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
  // NCCL's own reduce-scatter and all-gather take equal counts; unequal ones (ZeRO's shards of a
  // segment) become one reduce or broadcast per root, grouped. A reduce-scatter's result goes
  // through scratch: in place, a root's output would overlap another root's input.
  std::unique_ptr<Work> ReduceScatterSumAsync(const void* send, void* recv,
                                              const std::vector<size_t>& counts,
                                              DType dtype) override {
    if (!OnDevice(recv)) return boot_.ReduceScatterSumAsync(send, recv, counts, dtype);
    const size_t es = DTypeSize(dtype), mine = counts[size_t(rank())];
    void* tmp = Scratch(mine * es);
    Begin();
    if (Equal(counts)) {
      KEEL_NCCL(ncclReduceScatter(send, tmp, mine, TypeOf(dtype), ncclSum, comm_, stream_));
    } else {
      PerRoot(counts, es, [&](int r, size_t off, size_t n) {
        KEEL_NCCL(ncclReduce(static_cast<const char*>(send) + off, tmp, n, TypeOf(dtype), ncclSum,
                             r, comm_, stream_));
      });
    }
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
    if (Equal(counts)) {
      KEEL_NCCL(ncclAllGather(send, recv, counts[0], TypeOf(dtype), comm_, stream_));
    } else {
      PerRoot(counts, es, [&](int r, size_t off, size_t n) {
        KEEL_NCCL(ncclBroadcast(r == rank() ? send : nullptr, static_cast<char*>(recv) + off, n,
                                TypeOf(dtype), r, comm_, stream_));
      });
    }
    return End();
  }

  std::unique_ptr<Work> AllToAllAsync(const void* send, void* recv,
                                      const std::vector<size_t>& counts) override {
    if (!OnDevice(recv)) return boot_.AllToAllAsync(send, recv, counts);
    const size_t mine = counts[size_t(rank())];
    Begin();
    KEEL_NCCL(ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t n = counts[size_t(r)];
      if (n)
        KEEL_NCCL(ncclSend(static_cast<const char*>(send) + off, n, ncclChar, r, comm_, stream_));
      if (mine)
        KEEL_NCCL(ncclRecv(static_cast<char*>(recv) + size_t(r) * mine, mine, ncclChar, r, comm_,
                           stream_));
      off += n;
    }
    KEEL_NCCL(ncclGroupEnd());
    return End();
  }
  // Host work, ordered with the host buffers' operations (which go through the bootstrap).
  std::unique_ptr<Work> ThenAsync(std::function<std::string()> fn) override {
    return boot_.ThenAsync(std::move(fn));
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
    if (!OnDevice(data)) return boot_.Send(data, bytes, peer);
    std::vector<char> host(bytes);
    Check(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    boot_.Send(host.data(), bytes, peer);
  }
  void Recv(void* data, size_t bytes, int peer) override {
    if (!OnDevice(data)) return boot_.Recv(data, bytes, peer);
    std::vector<char> host(bytes);
    boot_.Recv(host.data(), bytes, peer);
    Check(cudaMemcpy(data, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::unique_ptr<Work> SendAsync(const void* data, size_t bytes, int peer, int tag) override {
    if (!OnDevice(data)) return boot_.SendAsync(data, bytes, peer, tag);
    std::vector<char> host(bytes);  // cudaMemcpy waits for the kernels that wrote `data`
    Check(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    auto inner = boot_.SendAsync(host.data(), bytes, peer, tag);
    return std::make_unique<StagedWork>(std::move(inner), std::move(host), nullptr);
  }
  std::unique_ptr<Work> RecvAsync(void* data, size_t bytes, int peer, int tag) override {
    if (!OnDevice(data)) return boot_.RecvAsync(data, bytes, peer, tag);
    std::vector<char> host(bytes);
    auto inner = boot_.RecvAsync(host.data(), bytes, peer, tag);
    return std::make_unique<StagedWork>(std::move(inner), std::move(host), data);
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
  static bool Equal(const std::vector<size_t>& counts) {
    for (size_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }
  // f(root, byte offset, count) for each rank with a non-empty slice, in one NCCL group.
  template <typename F>
  void PerRoot(const std::vector<size_t>& counts, size_t es, F&& f) {
    KEEL_NCCL(ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < size(); ++r) {
      if (counts[size_t(r)]) f(r, off * es, counts[size_t(r)]);
      off += counts[size_t(r)];
    }
    KEEL_NCCL(ncclGroupEnd());
  }
  // The collective's stream waits for the compute stream's kernels issued so far.
  void Begin() {
    cudaEvent_t ready;
    Check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(ready, kComputeStream), "cudaEventRecord");
    Check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
  }
  std::unique_ptr<Work> End() {
    cudaEvent_t done;
    Check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(done, stream_), "cudaEventRecord");
    return std::make_unique<NcclWork>(done, state_);
  }
  // Stream-ordered on the comm's stream: no device-wide synchronization while peers wait.
  void* Scratch(size_t bytes) {
    if (scratch_bytes_ < bytes) {
      if (scratch_) Check(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync");
      Check(cudaMallocAsync(&scratch_, bytes, stream_), "cudaMallocAsync");
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  Comm& boot_;
  std::unique_ptr<Comm> owned_;
  std::shared_ptr<NcclState> state_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

}  // namespace keel::parallel

// The plugin's entry points (core/plugin.h): parallel::MakeNcclComm calls the first and owns
// what it returns.
extern "C" keel::parallel::Comm* keel_nccl_comm(keel::parallel::Comm* bootstrap) {
  return new keel::parallel::NcclComm(*bootstrap, nullptr);
}
extern "C" const char* keel_plugin_interface() { return KEEL_PLUGIN_INTERFACE; }
