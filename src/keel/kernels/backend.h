// The one interface between the model, optimizer and step and what they compute on, about the
// size of ggml's backend interface: the memory of core/memory.h (allocate, zero, copy within and
// across host↔device), a stream to order work on, and the kernel operations of both model
// families, forward and backward as pairs. The CPU backend (cpu/) is keel's oneDNN and OpenMP
// kernels over host memory; the CUDA backend (cuda/, built where nvcc is, as the run-time loaded
// libkeel_cuda.so) is cuBLASLt and keel's own kernels over device memory.
//
// Every pointer an operation takes lives in the backend's memory, except where a comment says
// host. Operations are ordered on the backend's compute stream: on the CPU they have finished on
// return, on a GPU they have been issued, and Memory's copies to the host wait for them.
// The typed front doors (float or bf16 activations; weights of the same type; gradients, biases
// and statistics fp32) forward to the type-erased virtual operations that a backend implements.
//
//   const Backend& be = kernels::Get(Device::kCuda);
//   Buffer x(be, n * sizeof(bf16));
//   be.MatmulForward(out, x.as<bf16>(), w, bias, M, K, N);
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "keel/core/dtype.h"
#include "keel/core/fp8.h"
#include "keel/core/memory.h"
#include "keel/kernels/op_args.h"

namespace keel::kernels {

enum class Device { kCpu, kCuda };
const char* DeviceName(Device d);
// "cpu" or "cuda"; false for anything else.
bool ParseDevice(const std::string& s, Device* out);

// The backend of `d`: the process-wide CPU one, or the CUDA one on this process's GPU, from the
// plugin libkeel_cuda.so (core/plugin.h) loaded on first use. Throws BadInput, one line naming
// what is missing, when the plugin, a CUDA library, the driver or a GPU is not there.
const class Backend& Get(Device d);
// The CPU backend, for what runs on the host whatever the run's device: the models' defaults,
// inference, and commands that time this CPU (keel plan --accelerator this-cpu, preflight).
const class Backend& Cpu();
// Whether this keel was built with the CUDA backend (and NCCL): its plugin file is in place.
bool CudaBuilt();

class Backend : public Memory {
 public:
  virtual Device device() const = 0;
  // The device's name and its dense peak FLOP/s in `t` from its data sheet (MFU's denominator);
  // 0 where unknown. The CPU's is measured instead (monitor/machine_probe.h).
  virtual std::string name() const = 0;
  virtual double PeakFlops(DType /*t*/) const { return 0; }
  // Whether matrix products of `t` (bf16, fp16) run in fp32 on widened copies (same results,
  // slower): on a CPU for which oneDNN has no kernel of the type (bf16 without AVX-512, fp16
  // without AVX512-FP16). A GPU multiplies both natively: false.
  virtual bool ProductsEmulated(DType) const { return false; }
  // Waits for everything issued on the compute stream.
  virtual void Synchronize() const = 0;
  // An event recorded on the compute stream now, and a wait for it from the host; lets a caller
  // (checkpoint staging) know that the operations before a point have finished.
  virtual void* RecordEvent() const = 0;
  virtual void WaitEvent(void* event) const = 0;
  virtual void DestroyEvent(void* event) const = 0;

  // out (M,N) = alpha · inp (M,K) · weight (N,K)ᵀ + bias (N, fp32; may be null); `accumulate`
  // adds to out.
  template <typename T>
  void MatmulForward(T* out, const T* inp, const T* weight, const float* bias, int M, int K, int N,
                     bool accumulate = false, float alpha = 1.0f) const {
    MatmulForwardOp(DTypeOf<T>(), out, inp, weight, bias, M, K, N, accumulate, alpha);
  }
  // dinp = alpha·dout·weight (overwritten, or added with `accumulate`; may be null), dweight +=
  // alpha·doutᵀ·inp (may be null: a frozen weight, no product), dbias += Σ rows dout (may be null).
  template <typename T>
  void MatmulBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                      const T* weight, int M, int K, int N, float alpha = 1.0f,
                      bool accumulate = false) const {
    MatmulBackwardOp(DTypeOf<T>(), dinp, dweight, dbias, dout, inp, weight, M, K, N, alpha,
                     accumulate);
  }
  // Causal attention over qkv (B,T, C + 2·C·NKV/NH) into out (B,T,C); lse (B,NH,T) for backward.
  // doc_start (B·T, host memory; null: none): document masking, query (b, i) sees keys from
  // doc_start[b·T + i] to i (cpu/attention.h).
  // key_end (B·T, host memory; null: none): query (b, i) also sees keys before key_end[b·T + i]
  // only (context parallelism's ring blocks).
  template <typename T>
  void AttentionForward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, int NKV = 0,
                        const int32_t* doc_start = nullptr,
                        const int32_t* key_end = nullptr) const {
    AttentionForwardOp(DTypeOf<T>(), out, lse, qkv, B, T_, C, NH, NKV ? NKV : NH, doc_start,
                       key_end);
  }
  template <typename T>
  void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                         int B, int T_, int C, int NH, int NKV = 0,
                         const int32_t* doc_start = nullptr,
                         const int32_t* key_end = nullptr) const {
    AttentionBackwardOp(DTypeOf<T>(), dqkv, dout, qkv, out, lse, B, T_, C, NH, NKV ? NKV : NH,
                        doc_start, key_end);
  }
  template <typename T>
  void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                        const T* bias, int N, int C) const {
    LayerNormForwardOp(DTypeOf<T>(), out, mean, rstd, inp, weight, bias, N, C);
  }
  // dinp += ∂/∂inp (accumulates into the residual stream's gradient); dweight, dbias +=.
  template <typename T>
  void LayerNormBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                         const T* weight, const float* mean, const float* rstd, int N,
                         int C) const {
    LayerNormBackwardOp(DTypeOf<T>(), dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  template <typename T>
  void RmsNormForward(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                      float eps) const {
    RmsNormForwardOp(DTypeOf<T>(), out, rstd, inp, weight, N, C, eps);
  }
  template <typename T>
  void RmsNormBackward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                       const float* rstd, int N, int C) const {
    RmsNormBackwardOp(DTypeOf<T>(), dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  template <typename T>
  void GeluForward(T* out, const T* inp, size_t n) const {
    GeluForwardOp(DTypeOf<T>(), out, inp, n);
  }
  template <typename T>
  void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n) const {
    GeluBackwardOp(DTypeOf<T>(), dinp, inp, dout, n);
  }
  // gate_up (N, 2F): out (N,F) = silu(gate)·up.
  template <typename T>
  void SwigluForward(T* out, const T* gate_up, int N, int F) const {
    SwigluForwardOp(DTypeOf<T>(), out, gate_up, N, F);
  }
  template <typename T>
  void SwigluBackward(T* dgate_up, const T* gate_up, const T* dout, int N, int F) const {
    SwigluBackwardOp(DTypeOf<T>(), dgate_up, gate_up, dout, N, F);
  }
  // Rotary embedding of the q and k heads of qkv, in place (Hugging Face's rotate-half).
  template <typename T>
  void RopeForward(T* qkv, int B, int T_, int NH, int NKV, int hs, float theta,
                   int pos0 = 0) const {
    RopeOp(DTypeOf<T>(), qkv, B, T_, NH, NKV, hs, theta, pos0, /*backward=*/false);
  }
  template <typename T>
  void RopeBackward(T* dqkv, int B, int T_, int NH, int NKV, int hs, float theta,
                    int pos0 = 0) const {
    RopeOp(DTypeOf<T>(), dqkv, B, T_, NH, NKV, hs, theta, pos0, /*backward=*/true);
  }
  // tokens (B·T int32, in this backend's memory); rows of wte [v0, v1) only (vocabulary
  // parallelism); wpe may be null.
  template <typename T>
  void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                      int C, int v0 = 0, int v1 = INT_MAX) const {
    EncoderForwardOp(DTypeOf<T>(), out, tokens, wte, wpe, B, T_, C, v0, v1);
  }
  template <typename T>
  void EncoderBackward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B,
                       int T_, int C, int v0 = 0, int v1 = INT_MAX) const {
    EncoderBackwardOp(DTypeOf<T>(), dwte, dwpe, dout, tokens, B, T_, C, v0, v1);
  }
  // The classifier fused with cross-entropy in vocabulary chunks (cpu/classifier.h).
  template <typename T>
  void ClassifierForward(float* losses, const T* x, const T* wte, const int32_t* targets, int M,
                         int C, int V, int Vp, const VocabShard* shard = nullptr) const {
    ClassifierOp(DTypeOf<T>(), losses, nullptr, nullptr, x, wte, targets, 0.0f, M, C, V, Vp, shard);
  }
  template <typename T>
  void ClassifierForwardBackward(float* losses, T* dx, float* dwte, const T* x, const T* wte,
                                 const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                                 const VocabShard* shard = nullptr) const {
    ClassifierOp(DTypeOf<T>(), losses, dx, dwte, x, wte, targets, dloss, M, C, V, Vp, shard);
  }
  template <typename T>
  void ClassifierLogits(float* logits, const T* x, const T* wte, int M, int C, int V) const {
    ClassifierLogitsOp(DTypeOf<T>(), logits, x, wte, M, C, V);
  }

  // out[i] = scales[i / group] · the value of code i (QuantFormat), i < n: a quantized matrix, or a
  // run of its rows, in the working dtype. `codes` points at element 0's byte (NF4: n and the
  // first element even), `scales` at its group's scale.
  template <typename T>
  void Dequantize(T* out, const uint8_t* codes, const float* scales, size_t n, size_t group,
                  QuantFormat f) const {
    DequantizeOp(DTypeOf<T>(), out, codes, scales, n, group, f);
  }

  // fp8 emulation (core/fp8.h). AbsMax: the largest |x| of n elements (NaN where one is NaN).
  // Fp8Round: out = RoundFp8(in·scale, f) / scale elementwise (out may be in), the tensor as an
  // fp8 product sees it; with power-of-two scales a bf16 product of two such tensors, accumulated
  // in fp32, is the fp8 product.
  // fp8 products on fp8 hardware (a GPU with fp8 tensor cores, for these shapes): x and w rounded
  // to E4M3 and dout to E5M2 at the given scales, multiplied with fp32 accumulation, bf16 in and
  // out. Forward: out = x·wᵀ + bias (+= out with `accumulate`); Backward: dinp = dout·w
  // (overwritten), dweight += doutᵀ·x (may be null). Where NativeFp8 is false the caller emulates
  // them with Fp8Round and the bf16 product (model/fp8_products.h), as the CPU does.
  virtual bool NativeFp8(int /*M*/, int /*K*/, int /*N*/) const { return false; }
  virtual void MatmulFp8Forward(bf16* out, const bf16* x, const bf16* w, const float* bias, int M,
                                int K, int N, float sx, float sw, bool accumulate) const;
  virtual void MatmulFp8Backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* x,
                                 const bf16* w, int M, int K, int N, float sdy, float sx,
                                 float sw) const;
  template <typename T>
  float AbsMax(const T* x, size_t n) const {
    return AbsMaxOp(DTypeOf<T>(), x, n);
  }
  template <typename T>
  void Fp8Round(T* out, const T* in, size_t n, float scale, Fp8Format f) const {
    Fp8RoundOp(DTypeOf<T>(), out, in, n, scale, f);
  }

  // out[r·cols + c] (+= with `accumulate`) x[r·cols + c]·m.scale where DropoutMask `m` keeps
  // element (r, c), else 0 (+ 0): LoRA dropout's forward (x → out), and its backward (the
  // gradient through it, accumulated into the input's).
  template <typename T>
  void Dropout(T* out, const T* x, int rows, int cols, const DropoutMask& m,
               bool accumulate) const {
    DropoutOp(DTypeOf<T>(), out, x, rows, cols, m, accumulate);
  }

  // DoRA (Liu et al. 2024) around an adapted product y = g ⊙ z + bias, z = x·Wᵀ + s·(x·Aᵀ)·Bᵀ,
  // g = magnitude / ‖W + s·B·A‖ per output row (the norm held constant in backward, as DoRA's
  // paper and PEFT do). DoraNorm: per row o of W (out, in), with A (r, in) and B (out, r), the
  // norm's inverse (0 where the norm is 0) and scale[o] = magnitude[o] · inv_norm[o], from fp32
  // sums; with a null `magnitude`, inv_norm[o] gets the row's Σ v² instead and `scale` is left as
  // it is (a tensor-parallel shard's part of the norm, which the caller completes). DoraScale:
  // out[i, c] = z[i, c]·scale[c] + bias[c] (bias may be null; + out with
  // `accumulate`), in place when out is z. DoraMagnitudeGrad: dmag[c] += inv_norm[c] · Σᵢ
  // dy[i, c]·z[i, c], each column summed in a fixed order (the same value at any thread count).
  template <typename T>
  void DoraNorm(float* scale, float* inv_norm, const float* magnitude, const T* W, const T* A,
                const T* B, int out, int in, int r, float s) const {
    DoraNormOp(DTypeOf<T>(), scale, inv_norm, magnitude, W, A, B, out, in, r, s);
  }
  template <typename T>
  void DoraScale(T* out, const T* z, const float* scale, const float* bias, int rows, int cols,
                 bool accumulate) const {
    DoraScaleOp(DTypeOf<T>(), out, z, scale, bias, rows, cols, accumulate);
  }
  template <typename T>
  void DoraMagnitudeGrad(float* dmag, const T* dy, const T* z, const float* inv_norm, int rows,
                         int cols) const {
    DoraMagnitudeGradOp(DTypeOf<T>(), dmag, dy, z, inv_norm, rows, cols);
  }

  // AdamW (cpu/adamw.h) over what `s` names (op_args.h: fp32 master and an optional bf16 copy,
  // or master-less bf16 weights; fp32 or bf16 moments).
  virtual void AdamWUpdate(const AdamWState& s, size_t n, const AdamWParams& p) const = 0;
  void AdamWUpdate(float* master, bf16* working, float* m, float* v, const float* grad, size_t n,
                   const AdamWParams& p) const {
    AdamWUpdate(AdamWState{master, working, m, v, false, grad}, n, p);
  }
  // Σ x², accumulated in fp64 in a fixed order (the same value whatever the thread count).
  virtual double SumSquares(const float* x, size_t n) const = 0;
  // The same over bf16 values (optim.grad_dtype = "bf16"), where the backend keeps bf16
  // gradients (the CPU's); elsewhere it throws, as do the two below.
  virtual double SumSquares(const bf16* x, size_t n) const;
  // acc = round-to-nearest-even(acc + x): an fp32 bucket of gradients into bf16 ones.
  virtual void AccumulateBf16(bf16* acc, const float* x, size_t n) const;
  // x += acc, widened exactly: bf16 gradients into an fp32 bucket before it is reduced.
  virtual void AddBf16To(float* x, const bf16* acc, size_t n) const;
  // Round-to-nearest-even of n fp32 values.
  virtual void ToBf16(bf16* out, const float* in, size_t n) const = 0;
  // The exact widening of n bf16 values.
  virtual void ToF32(float* out, const bf16* in, size_t n) const = 0;
  // The same rounding into fp16 (overflow to infinity), where the backend runs fp16 (the
  // CPU's); elsewhere it throws.
  virtual void ToF16(f16* out, const float* in, size_t n) const;
  // A 16-bit working copy (`t`: kBF16 or kF16) from fp32.
  void Narrow(DType t, void* out, const float* in, size_t n) const {
    if (t == DType::kF16) return ToF16(static_cast<f16*>(out), in, n);
    ToBf16(static_cast<bf16*>(out), in, n);
  }
  // dst += src, elementwise (a reduce-scattered gradient into the shard).
  virtual void AddTo(float* dst, const float* src, size_t n) const = 0;

 protected:
  virtual void MatmulForwardOp(DType t, void* out, const void* inp, const void* weight,
                               const float* bias, int M, int K, int N, bool accumulate,
                               float alpha) const = 0;
  virtual void MatmulBackwardOp(DType t, void* dinp, float* dweight, float* dbias, const void* dout,
                                const void* inp, const void* weight, int M, int K, int N,
                                float alpha, bool accumulate) const = 0;
  virtual void AttentionForwardOp(DType t, void* out, float* lse, const void* qkv, int B, int T,
                                  int C, int NH, int NKV, const int32_t* doc_start,
                                  const int32_t* key_end) const = 0;
  virtual void AttentionBackwardOp(DType t, void* dqkv, const void* dout, const void* qkv,
                                   const void* out, const float* lse, int B, int T, int C, int NH,
                                   int NKV, const int32_t* doc_start,
                                   const int32_t* key_end) const = 0;
  virtual void LayerNormForwardOp(DType t, void* out, float* mean, float* rstd, const void* inp,
                                  const void* weight, const void* bias, int N, int C) const = 0;
  virtual void LayerNormBackwardOp(DType t, void* dinp, float* dweight, float* dbias,
                                   const void* dout, const void* inp, const void* weight,
                                   const float* mean, const float* rstd, int N, int C) const = 0;
  virtual void RmsNormForwardOp(DType t, void* out, float* rstd, const void* inp,
                                const void* weight, int N, int C, float eps) const = 0;
  virtual void RmsNormBackwardOp(DType t, void* dinp, float* dweight, const void* dout,
                                 const void* inp, const void* weight, const float* rstd, int N,
                                 int C) const = 0;
  virtual void GeluForwardOp(DType t, void* out, const void* inp, size_t n) const = 0;
  virtual void GeluBackwardOp(DType t, void* dinp, const void* inp, const void* dout,
                              size_t n) const = 0;
  virtual void SwigluForwardOp(DType t, void* out, const void* gate_up, int N, int F) const = 0;
  virtual void SwigluBackwardOp(DType t, void* dgate_up, const void* gate_up, const void* dout,
                                int N, int F) const = 0;
  virtual void RopeOp(DType t, void* qkv, int B, int T, int NH, int NKV, int hs, float theta,
                      int pos0, bool backward) const = 0;
  virtual void EncoderForwardOp(DType t, void* out, const int32_t* tokens, const void* wte,
                                const void* wpe, int B, int T, int C, int v0, int v1) const = 0;
  virtual void EncoderBackwardOp(DType t, float* dwte, float* dwpe, const void* dout,
                                 const int32_t* tokens, int B, int T, int C, int v0,
                                 int v1) const = 0;
  // dx null: forward only.
  virtual void ClassifierOp(DType t, float* losses, void* dx, float* dwte, const void* x,
                            const void* wte, const int32_t* targets, float dloss, int M, int C,
                            int V, int Vp, const VocabShard* shard) const = 0;
  virtual void ClassifierLogitsOp(DType t, float* logits, const void* x, const void* wte, int M,
                                  int C, int V) const = 0;
  virtual void DequantizeOp(DType t, void* out, const uint8_t* codes, const float* scales, size_t n,
                            size_t group, QuantFormat f) const = 0;
  virtual float AbsMaxOp(DType t, const void* x, size_t n) const = 0;
  virtual void Fp8RoundOp(DType t, void* out, const void* in, size_t n, float scale,
                          Fp8Format f) const = 0;
  virtual void DropoutOp(DType t, void* out, const void* x, int rows, int cols,
                         const DropoutMask& m, bool accumulate) const = 0;
  virtual void DoraNormOp(DType t, float* scale, float* inv_norm, const float* magnitude,
                          const void* W, const void* A, const void* B, int out, int in, int r,
                          float s) const = 0;
  virtual void DoraScaleOp(DType t, void* out, const void* z, const float* scale, const float* bias,
                           int rows, int cols, bool accumulate) const = 0;
  virtual void DoraMagnitudeGradOp(DType t, float* dmag, const void* dy, const void* z,
                                   const float* inv_norm, int rows, int cols) const = 0;
};

}  // namespace keel::kernels
