// The CUDA backend's memory, events and the dispatch of its operations to the kernel files.
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/kernels/cuda/adamw.cuh"
#include "keel/kernels/cuda/attention.cuh"
#include "keel/kernels/cuda/backend_cuda.h"
#include "keel/kernels/cuda/classifier.cuh"
#include "keel/kernels/cuda/dequantize.cuh"
#include "keel/kernels/cuda/dora.cuh"
#include "keel/kernels/cuda/dropout.cuh"
#include "keel/kernels/cuda/encoder.cuh"
#include "keel/kernels/cuda/fp8.cuh"
#include "keel/kernels/cuda/gelu.cuh"
#include "keel/kernels/cuda/layernorm.cuh"
#include "keel/kernels/cuda/matmul.cuh"
#include "keel/kernels/cuda/rmsnorm.cuh"
#include "keel/kernels/cuda/rope.cuh"
#include "keel/kernels/cuda/swiglu.cuh"

namespace keel::kernels::cuda {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) ThrowRuntime(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

void Check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    ThrowRuntime(std::string("cuBLASLt: ") + what + ": status " + std::to_string(int(s)));
}

void* Scratch(int slot, size_t bytes, cudaStream_t stream) {
  struct Block {
    void* p = nullptr;
    size_t bytes = 0;
  };
  static std::vector<Block> blocks(16);
  Block& b = blocks.at(size_t(slot));
  if (b.bytes < bytes) {
    // Stream-ordered: cudaFree would wait for the whole device, NCCL's kernels included, which
    // may be waiting for peers that wait for this rank.
    if (b.p) KEEL_CUDA(cudaFreeAsync(b.p, stream));
    KEEL_CUDA(cudaMallocAsync(&b.p, bytes, stream));
    b.bytes = bytes;
  }
  return b.p;
}

namespace {

class Cuda final : public Backend {
 public:
  Cuda() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    // The runtime reports a missing driver (no libcuda.so.1) and a driver older than itself the
    // same way; both are the machine's, not keel's.
    if (e == cudaErrorInsufficientDriver)
      ThrowBadInput(
          "[train] device = \"cuda\": no usable NVIDIA driver (libcuda.so.1 missing or older "
          "than CUDA " +
          std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 100 / 10) +
          ")");
    if (e != cudaSuccess || n == 0)
      ThrowBadInput(std::string("[train] device = \"cuda\": no GPU is visible to this process (") +
                    (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    // One GPU per rank: the launcher's local rank picks it (OpenMPI, Slurm), else the first.
    int local = 0;
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"})
      if (const char* s = std::getenv(v)) {
        local = std::atoi(s);
        break;
      }
    device_ = local % n;
    KEEL_CUDA(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    KEEL_CUDA(cudaGetDeviceProperties(&prop, device_));
    name_ = prop.name;
    const char* emulate = std::getenv("KEEL_FP8_EMULATE");
    fp8_ = prop.major * 10 + prop.minor >= 89 && !(emulate && std::string(emulate) == "1");
  }
  Device device() const override { return Device::kCuda; }
  std::string name() const override { return name_; }
  // Dense tensor-core peaks (SXM parts): bf16, and TF32 for fp32 (the products keel's fp32 runs
  // use only with KEEL_TF32=1; without it fp32 runs on the CUDA cores, 67 TFLOP/s on Hopper).
  double PeakFlops(DType t) const override {
    struct Known {
      const char* name;
      double bf16, fp32;
    };
    static const Known known[] = {
        {"H200", 989.4e12, 66.9e12}, {"H100", 989.4e12, 66.9e12}, {"A100", 312e12, 19.5e12}};
    for (const Known& k : known)
      if (name_.find(k.name) != std::string::npos) return t == DType::kBF16 ? k.bf16 : k.fp32;
    return 0;
  }
  bool host_visible() const override { return false; }
  void* Alloc(size_t bytes) const override {
    void* p = nullptr;
    if (cudaMalloc(&p, (bytes + 63) / 64 * 64) != cudaSuccess) throw std::bad_alloc();
    return p;
  }
  void Free(void* p) const override { cudaFree(p); }
  void Zero(void* p, size_t bytes) const override {
    if (bytes) KEEL_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void Copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes) KEEL_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void FromHost(void* dst, const void* host, size_t bytes) const override {
    if (bytes) KEEL_CUDA(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    if (bytes) KEEL_CUDA(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
  }
  void PinHost(void* p, size_t bytes) const override {
    // Portable: the writer thread and OpenMP threads copy into it too, whatever their device.
    KEEL_CUDA(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
  }
  void UnpinHost(void* p) const override { cudaHostUnregister(p); }
  // A stream of its own for the staging copies, used from the checkpoint writer's thread (which
  // binds itself to this rank's GPU first).
  void* CopyStream() const override {
    KEEL_CUDA(cudaSetDevice(device_));
    if (!copy_) KEEL_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    cudaEvent_t issued;
    KEEL_CUDA(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
    KEEL_CUDA(cudaEventRecord(issued, stream_));
    KEEL_CUDA(cudaStreamWaitEvent(copy_, issued, 0));
    cudaEventDestroy(issued);
    return copy_;
  }
  void ToHostAsync(void* host, const void* src, size_t bytes, void* stream) const override {
    if (bytes)
      KEEL_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(stream)));
  }
  void WaitCopies(void* stream) const override {
    KEEL_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  void Synchronize() const override { KEEL_CUDA(cudaDeviceSynchronize()); }
  void* RecordEvent() const override {
    cudaEvent_t e;
    KEEL_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    KEEL_CUDA(cudaEventRecord(e, stream_));
    return e;
  }
  void WaitEvent(void* e) const override {
    KEEL_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  }
  void DestroyEvent(void* e) const override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

  using Backend::AdamWUpdate;
  void AdamWUpdate(const AdamWState& s, size_t n, const AdamWParams& p) const override {
    cuda::AdamW(s, n, p, stream_);
  }
  using Backend::SumSquares;  // bf16 gradients are the CPU's (optim.grad_dtype)
  double SumSquares(const float* x, size_t n) const override {
    return cuda::SumSquares(x, n, stream_);
  }
  void ToBf16(bf16* out, const float* in, size_t n) const override {
    cuda::ToBf16(out, in, n, stream_);
  }
  void ToF32(float* out, const bf16* in, size_t n) const override {
    cuda::ToF32(out, in, n, stream_);
  }
  void AddTo(float* dst, const float* src, size_t n) const override {
    cuda::AddTo(dst, src, n, stream_);
  }

 protected:
  void MatmulForwardOp(DType t, void* out, const void* inp, const void* weight, const float* bias,
                       int M, int K, int N, bool accumulate, float alpha) const override {
    cuda::MatmulForward(t, out, inp, weight, bias, M, K, N, accumulate, alpha, stream_);
  }
  void MatmulBackwardOp(DType t, void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, int M, int K, int N, float alpha,
                        bool accumulate) const override {
    cuda::MatmulBackward(t, dinp, dweight, dbias, dout, inp, weight, M, K, N, alpha, accumulate,
                         stream_);
  }
  void AttentionForwardOp(DType t, void* out, float* lse, const void* qkv, int B, int T, int C,
                          int NH, int NKV, const int32_t* doc_start,
                          const int32_t* key_end) const override {
    RefuseDocumentMask(doc_start || key_end);
    cuda::AttentionForward(t, out, lse, qkv, B, T, C, NH, NKV, stream_);
  }
  void AttentionBackwardOp(DType t, void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse, int B, int T, int C, int NH, int NKV,
                           const int32_t* doc_start, const int32_t* key_end) const override {
    RefuseDocumentMask(doc_start || key_end);
    cuda::AttentionBackward(t, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, stream_);
  }
  // The CUDA kernels have no document mask yet: a packed chat run would silently attend across
  // conversations.
  static void RefuseDocumentMask(bool masked) {
    if (masked)
      ThrowBadInput(
          "document masking (loss-masked data packed by conversation) runs on the CPU backend "
          "only so far; train on the CPU, or prepare the data with --format text");
  }
  void LayerNormForwardOp(DType t, void* out, float* mean, float* rstd, const void* inp,
                          const void* weight, const void* bias, int N, int C) const override {
    cuda::LayerNormForward(t, out, mean, rstd, inp, weight, bias, N, C, stream_);
  }
  void LayerNormBackwardOp(DType t, void* dinp, float* dweight, float* dbias, const void* dout,
                           const void* inp, const void* weight, const float* mean,
                           const float* rstd, int N, int C) const override {
    cuda::LayerNormBackward(t, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream_);
  }
  void RmsNormForwardOp(DType t, void* out, float* rstd, const void* inp, const void* weight, int N,
                        int C, float eps) const override {
    cuda::RmsNormForward(t, out, rstd, inp, weight, N, C, eps, stream_);
  }
  void RmsNormBackwardOp(DType t, void* dinp, float* dweight, const void* dout, const void* inp,
                         const void* weight, const float* rstd, int N, int C) const override {
    cuda::RmsNormBackward(t, dinp, dweight, dout, inp, weight, rstd, N, C, stream_);
  }
  void GeluForwardOp(DType t, void* out, const void* inp, size_t n) const override {
    cuda::GeluForward(t, out, inp, n, stream_);
  }
  void GeluBackwardOp(DType t, void* dinp, const void* inp, const void* dout,
                      size_t n) const override {
    cuda::GeluBackward(t, dinp, inp, dout, n, stream_);
  }
  // fp8 tensor cores: Ada and Hopper (compute capability 8.9 and up), shapes in multiples of 16
  // (cuBLASLt's fp8 alignment). KEEL_FP8_EMULATE=1 takes the emulation instead (the device check
  // compares the two).
  bool NativeFp8(int M, int K, int N) const override {
    return fp8_ && M % 16 == 0 && K % 16 == 0 && N % 16 == 0;
  }
  void MatmulFp8Forward(bf16* out, const bf16* x, const bf16* w, const float* bias, int M, int K,
                        int N, float sx, float sw, bool accumulate) const override {
    cuda::MatmulFp8Forward(out, x, w, bias, M, K, N, sx, sw, accumulate, stream_);
  }
  void MatmulFp8Backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* x, const bf16* w,
                         int M, int K, int N, float sdy, float sx, float sw) const override {
    cuda::MatmulFp8Backward(dinp, dweight, dout, x, w, M, K, N, sdy, sx, sw, stream_);
  }
  float AbsMaxOp(DType t, const void* x, size_t n) const override {
    return cuda::AbsMax(t, x, n, stream_);
  }
  void Fp8RoundOp(DType t, void* out, const void* in, size_t n, float scale,
                  Fp8Format f) const override {
    cuda::Fp8Round(t, out, in, n, scale, f, stream_);
  }
  void DequantizeOp(DType t, void* out, const uint8_t* codes, const float* scales, size_t n,
                    size_t group, QuantFormat f) const override {
    cuda::Dequantize(t, out, codes, scales, n, group, f, stream_);
  }
  void DropoutOp(DType t, void* out, const void* x, int rows, int cols, const DropoutMask& m,
                 bool accumulate) const override {
    cuda::Dropout(t, out, x, rows, cols, m, accumulate, stream_);
  }
  void DoraNormOp(DType t, float* scale, float* inv_norm, const float* magnitude, const void* W,
                  const void* A, const void* B, int out, int in, int r, float s) const override {
    cuda::DoraNorm(t, scale, inv_norm, magnitude, W, A, B, out, in, r, s, stream_);
  }
  void DoraScaleOp(DType t, void* out, const void* z, const float* scale, const float* bias,
                   int rows, int cols, bool accumulate) const override {
    cuda::DoraScale(t, out, z, scale, bias, rows, cols, accumulate, stream_);
  }
  void DoraMagnitudeGradOp(DType t, float* dmag, const void* dy, const void* z,
                           const float* inv_norm, int rows, int cols) const override {
    cuda::DoraMagnitudeGrad(t, dmag, dy, z, inv_norm, rows, cols, stream_);
  }
  void SwigluForwardOp(DType t, void* out, const void* gate_up, int N, int F) const override {
    cuda::SwigluForward(t, out, gate_up, N, F, stream_);
  }
  void SwigluBackwardOp(DType t, void* dgate_up, const void* gate_up, const void* dout, int N,
                        int F) const override {
    cuda::SwigluBackward(t, dgate_up, gate_up, dout, N, F, stream_);
  }
  void RopeOp(DType t, void* qkv, int B, int T, int NH, int NKV, int hs, float theta, int pos0,
              bool backward) const override {
    cuda::Rope(t, qkv, B, T, NH, NKV, hs, theta, pos0, backward, stream_);
  }
  void EncoderForwardOp(DType t, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                        int B, int T, int C, int v0, int v1) const override {
    cuda::EncoderForward(t, out, tokens, wte, wpe, B, T, C, v0, v1, stream_);
  }
  void EncoderBackwardOp(DType t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                         int B, int T, int C, int v0, int v1) const override {
    cuda::EncoderBackward(t, dwte, dwpe, dout, tokens, B, T, C, v0, v1, stream_);
  }
  void ClassifierOp(DType t, float* losses, void* dx, float* dwte, const void* x, const void* wte,
                    const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                    const VocabShard* shard) const override {
    KEEL_CHECK(shard == nullptr, "CUDA backend: vocabulary parallelism is not built yet");
    cuda::Classifier(t, losses, dx, dwte, x, wte, targets, dloss, M, C, V, Vp, stream_);
  }
  void ClassifierLogitsOp(DType t, float* logits, const void* x, const void* wte, int M, int C,
                          int V) const override {
    cuda::ClassifierLogits(t, logits, x, wte, M, C, V, stream_);
  }

 private:
  int device_ = 0;
  std::string name_;
  bool fp8_ = false;  // native fp8 products (NativeFp8)
  // The compute stream every operation and Memory call is issued on: the legacy default stream,
  // which the synchronous copies (FromHost, ToHost) also use, so they wait for the kernels before
  // them; and which the NCCL communicator's collectives wait for (parallel/nccl/comm_nccl.cc).
  cudaStream_t stream_ = nullptr;
  mutable cudaStream_t copy_ = nullptr;
};

}  // namespace

const Backend& CudaBackend() {
  static const Cuda cuda;
  return cuda;
}

}  // namespace keel::kernels::cuda

// The plugin's entry points (core/plugin.h): kernels::Get(Device::kCuda) calls the first.
extern "C" const keel::kernels::Backend* keel_cuda_backend() {
  return &keel::kernels::cuda::CudaBackend();
}
extern "C" const char* keel_plugin_interface() { return KEEL_PLUGIN_INTERFACE; }
