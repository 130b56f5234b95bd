#include "keel/kernels/cpu/backend_cpu.h"

#include <omp.h>

#include <algorithm>

#include "keel/kernels/cpu/adamw.h"
#include "keel/kernels/cpu/attention.h"
#include "keel/kernels/cpu/classifier.h"
#include "keel/kernels/cpu/dequantize.h"
#include "keel/kernels/cpu/dora.h"
#include "keel/kernels/cpu/dropout.h"
#include "keel/kernels/cpu/encoder.h"
#include "keel/kernels/cpu/fp8.h"
#include "keel/kernels/cpu/gelu.h"
#include "keel/kernels/cpu/layernorm.h"
#include "keel/kernels/cpu/matmul.h"
#include "keel/kernels/cpu/rmsnorm.h"
#include "keel/kernels/cpu/rope.h"
#include "keel/kernels/cpu/swiglu.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
#include "keel/kernels/cpu/row_blocks.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// fn(offset, bytes) over [0, bytes) split across the OpenMP threads: the step's large Zero and Copy
// (the gradients before each step, 500 MB for GPT-2 124M; the residual stream before each
// row-parallel product) ran on one thread while the others waited, and one core's memset reaches
// about half the memory's write rate (500 MB: 52 ms on one core of a 2-core Xeon, 26 on two).
// Small ones, and calls from inside a parallel region, stay on the calling thread.
template <typename Fn>
void SplitBytes(size_t bytes, const Fn& fn) {
  constexpr size_t kMinBytes = size_t(1) << 20;
  if (bytes < kMinBytes || omp_in_parallel()) return fn(size_t(0), bytes);
#pragma omp parallel
  {
    const size_t n = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    const size_t chunk = (bytes / n + 63) / 64 * 64;
    const size_t lo = std::min(bytes, t * chunk), hi = std::min(bytes, lo + chunk);
    if (lo < hi) fn(lo, hi - lo);
  }
}

// Calls f with a value of the C++ type of `t` (float, bf16 or f16).
template <typename F>
void Typed(DType t, F&& f) {
  if (t == DType::kF32)
    f(float{});
  else if (t == DType::kBF16)
    f(bf16{});
  else
    f(f16{});
}

template <typename T>
T* P(void* p) {
  return static_cast<T*>(p);
}
template <typename T>
const T* P(const void* p) {
  return static_cast<const T*>(p);
}

class CpuImpl final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  bool ProductsEmulated(DType t) const override { return cpu::ProductsEmulated(t); }
  bool host_visible() const override { return true; }
  void* Alloc(size_t bytes) const override { return HostMemory().Alloc(bytes); }
  void Free(void* p) const override { HostMemory().Free(p); }
  void Zero(void* p, size_t bytes) const override {
    SplitBytes(bytes,
               [&](size_t at, size_t n) { HostMemory().Zero(static_cast<char*>(p) + at, n); });
  }
  void Copy(void* dst, const void* src, size_t bytes) const override {
    SplitBytes(bytes, [&](size_t at, size_t n) {
      HostMemory().Copy(static_cast<char*>(dst) + at, static_cast<const char*>(src) + at, n);
    });
  }
  void FromHost(void* dst, const void* host, size_t bytes) const override {
    HostMemory().Copy(dst, host, bytes);
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    HostMemory().Copy(host, src, bytes);
  }
  // Every operation has finished when it returns.
  void Synchronize() const override {}
  void* RecordEvent() const override { return nullptr; }
  void WaitEvent(void*) const override {}
  void DestroyEvent(void*) const override {}

  using Backend::AdamWUpdate;
  void AdamWUpdate(const AdamWState& s, size_t n, const AdamWParams& p) const override {
    cpu::AdamWUpdate(s, n, p);
  }
  double SumSquares(const float* x, size_t n) const override { return cpu::SumSquares(x, n); }
  double SumSquares(const bf16* x, size_t n) const override { return cpu::SumSquares(x, n); }
  void AccumulateBf16(bf16* acc, const float* x, size_t n) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) acc[i] = keel::ToBf16(keel::ToFloat(acc[i]) + x[i]);
  }
  void AddBf16To(float* x, const bf16* acc, size_t n) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) x[i] += keel::ToFloat(acc[i]);
  }
  // Here rather than core's ConvertF32ToBf16, so that it is compiled for this copy's ISA.
  void ToBf16(bf16* out, const float* in, size_t n) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) out[i] = keel::ToBf16(in[i]);
  }
  void ToF32(float* out, const bf16* in, size_t n) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) out[i] = keel::ToFloat(in[i]);
  }
  void ToF16(f16* out, const float* in, size_t n) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) out[i] = keel::ToF16(in[i]);
  }
  void AddTo(float* dst, const float* src, size_t n) const override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }

 protected:
  void MatmulForwardOp(DType t, void* out, const void* inp, const void* weight, const float* bias,
                       int M, int K, int N, bool accumulate, float alpha) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::MatmulForward<T>(P<T>(out), P<T>(inp), P<T>(weight), bias, M, K, N, accumulate, alpha);
    });
  }
  void MatmulBackwardOp(DType t, void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, int M, int K, int N, float alpha,
                        bool accumulate) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::MatmulBackward<T>(P<T>(dinp), dweight, dbias, P<T>(dout), P<T>(inp), P<T>(weight), M, K,
                             N, alpha, accumulate);
    });
  }
  void AttentionForwardOp(DType t, void* out, float* lse, const void* qkv, int B, int T, int C,
                          int NH, int NKV, const int32_t* doc_start,
                          const int32_t* key_end) const override {
    Typed(t, [&](auto z) {
      using U = decltype(z);
      cpu::AttentionForward<U>(P<U>(out), lse, P<U>(qkv), B, T, C, NH, NKV, doc_start, key_end);
    });
  }
  void AttentionBackwardOp(DType t, void* dqkv, const void* dout, const void* qkv, const void* out,
                           const float* lse, int B, int T, int C, int NH, int NKV,
                           const int32_t* doc_start, const int32_t* key_end) const override {
    Typed(t, [&](auto z) {
      using U = decltype(z);
      cpu::AttentionBackward<U>(P<U>(dqkv), P<U>(dout), P<U>(qkv), P<U>(out), lse, B, T, C, NH, NKV,
                                doc_start, key_end);
    });
  }
  void LayerNormForwardOp(DType t, void* out, float* mean, float* rstd, const void* inp,
                          const void* weight, const void* bias, int N, int C) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::LayerNormForward<T>(P<T>(out), mean, rstd, P<T>(inp), P<T>(weight), P<T>(bias), N, C);
    });
  }
  void LayerNormBackwardOp(DType t, void* dinp, float* dweight, float* dbias, const void* dout,
                           const void* inp, const void* weight, const float* mean,
                           const float* rstd, int N, int C) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::LayerNormBackward<T>(P<T>(dinp), dweight, dbias, P<T>(dout), P<T>(inp), P<T>(weight),
                                mean, rstd, N, C);
    });
  }
  void RmsNormForwardOp(DType t, void* out, float* rstd, const void* inp, const void* weight, int N,
                        int C, float eps) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::RmsNormForward<T>(P<T>(out), rstd, P<T>(inp), P<T>(weight), N, C, eps);
    });
  }
  void RmsNormBackwardOp(DType t, void* dinp, float* dweight, const void* dout, const void* inp,
                         const void* weight, const float* rstd, int N, int C) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::RmsNormBackward<T>(P<T>(dinp), dweight, P<T>(dout), P<T>(inp), P<T>(weight), rstd, N, C);
    });
  }
  void GeluForwardOp(DType t, void* out, const void* inp, size_t n) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::GeluForward<T>(P<T>(out), P<T>(inp), n);
    });
  }
  void GeluBackwardOp(DType t, void* dinp, const void* inp, const void* dout,
                      size_t n) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::GeluBackward<T>(P<T>(dinp), P<T>(inp), P<T>(dout), n);
    });
  }
  void DequantizeOp(DType t, void* out, const uint8_t* codes, const float* scales, size_t n,
                    size_t group, QuantFormat f) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::Dequantize<T>(P<T>(out), codes, scales, n, group, f);
    });
  }
  float AbsMaxOp(DType t, const void* x, size_t n) const override {
    float m = 0;
    Typed(t, [&](auto z) {
      using T = decltype(z);
      m = cpu::AbsMax<T>(P<T>(x), n);
    });
    return m;
  }
  void Fp8RoundOp(DType t, void* out, const void* in, size_t n, float scale,
                  Fp8Format f) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::Fp8Round<T>(P<T>(out), P<T>(in), n, scale, f);
    });
  }
  void DropoutOp(DType t, void* out, const void* x, int rows, int cols, const DropoutMask& m,
                 bool accumulate) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::Dropout<T>(P<T>(out), P<T>(x), rows, cols, m, accumulate);
    });
  }
  void DoraNormOp(DType t, float* scale, float* inv_norm, const float* magnitude, const void* W,
                  const void* A, const void* B, int out, int in, int r, float s) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::DoraNorm<T>(scale, inv_norm, magnitude, P<T>(W), P<T>(A), P<T>(B), out, in, r, s);
    });
  }
  void DoraScaleOp(DType t, void* out, const void* z, const float* scale, const float* bias,
                   int rows, int cols, bool accumulate) const override {
    Typed(t, [&](auto x) {
      using T = decltype(x);
      cpu::DoraScale<T>(P<T>(out), P<T>(z), scale, bias, rows, cols, accumulate);
    });
  }
  void DoraMagnitudeGradOp(DType t, float* dmag, const void* dy, const void* z,
                           const float* inv_norm, int rows, int cols) const override {
    Typed(t, [&](auto x) {
      using T = decltype(x);
      cpu::DoraMagnitudeGrad<T>(dmag, P<T>(dy), P<T>(z), inv_norm, rows, cols);
    });
  }
  void SwigluForwardOp(DType t, void* out, const void* gate_up, int N, int F) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::SwigluForward<T>(P<T>(out), P<T>(gate_up), N, F);
    });
  }
  void SwigluBackwardOp(DType t, void* dgate_up, const void* gate_up, const void* dout, int N,
                        int F) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::SwigluBackward<T>(P<T>(dgate_up), P<T>(gate_up), P<T>(dout), N, F);
    });
  }
  void RopeOp(DType t, void* qkv, int B, int T, int NH, int NKV, int hs, float theta, int pos0,
              bool backward) const override {
    Typed(t, [&](auto z) {
      using U = decltype(z);
      if (backward)
        cpu::RopeBackward<U>(P<U>(qkv), B, T, NH, NKV, hs, theta, pos0);
      else
        cpu::RopeForward<U>(P<U>(qkv), B, T, NH, NKV, hs, theta, pos0);
    });
  }
  void EncoderForwardOp(DType t, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                        int B, int T, int C, int v0, int v1) const override {
    Typed(t, [&](auto z) {
      using U = decltype(z);
      cpu::EncoderForward<U>(P<U>(out), tokens, P<U>(wte), P<U>(wpe), B, T, C, v0, v1);
    });
  }
  void EncoderBackwardOp(DType t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                         int B, int T, int C, int v0, int v1) const override {
    Typed(t, [&](auto z) {
      using U = decltype(z);
      cpu::EncoderBackward<U>(dwte, dwpe, P<U>(dout), tokens, B, T, C, v0, v1);
    });
  }
  void ClassifierOp(DType t, float* losses, void* dx, float* dwte, const void* x, const void* wte,
                    const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                    const VocabShard* shard) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      if (dx)
        cpu::ClassifierForwardBackward<T>(losses, P<T>(dx), dwte, P<T>(x), P<T>(wte), targets,
                                          dloss, M, C, V, Vp, shard);
      else
        cpu::ClassifierForward<T>(losses, P<T>(x), P<T>(wte), targets, M, C, V, Vp, shard);
    });
  }
  void ClassifierLogitsOp(DType t, float* logits, const void* x, const void* wte, int M, int C,
                          int V) const override {
    Typed(t, [&](auto z) {
      using T = decltype(z);
      cpu::ClassifierLogits<T>(logits, P<T>(x), P<T>(wte), M, C, V);
    });
  }
};

}  // namespace

const Backend& CpuBackend() {
  static const CpuImpl cpu;
  return cpu;
}

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS
