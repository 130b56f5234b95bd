// Matrix products on the CPU through oneDNN (brgemm kernels, AVX-512 / AMX / bf16 dot products).
// On CPUs where oneDNN has no bf16 product (no AVX-512), or where the CPU's bf16 instruction is
// slower than its fp32 FMA (kernels/cpu_isa.h), bf16 products run in fp32 on widened copies: the
// same inputs and fp32 accumulation, in another order.
//
// Legend: M rows of the input (B*T), K input features, N output features.
// Forward/backward pair in llm.c's order (outputs, inputs, weights, sizes). Backward *adds* into
// parameter gradients (fp32) and *overwrites* activation gradients.
//
//   MatmulForward(out, inp, weight, bias, M, K, N);   // out = inp · weightᵀ + bias
#pragma once

#include <cstddef>
#include <string>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

// The general product C = alpha·op(A)·op(B) + beta·C, with op(X) = X or Xᵀ, row-major, leading
// dimensions in elements. A and B share one dtype (fp32 or bf16), C may be fp32 or A's dtype;
// accumulation is fp32. `beta` must be 0 or 1. `bias` (length N, dtype of C or fp32) may be null.
// Primitives are created once per shape and cached.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  void* C = nullptr;
  int ldc = 0;
  DType ab_type = DType::kF32;
  DType c_type = DType::kF32;
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr;  // fp32 bias, added after alpha·AB
};
void Gemm(const GemmArgs& args);

// The oneDNN implementation that runs `args`' product ("gemm:jit", "brg:avx512_core", ...; created
// and cached as Gemm would), or "widened to fp32" for a 16-bit product the CPU has none for.
std::string GemmKernel(const GemmArgs& args);

// out (M,N) = inp (M,K) · weight (N,K)ᵀ + bias (N); bias may be null. If `accumulate`, the product
// is added to what `out` holds (used to fold a residual add into the projection).
// Whether products of `t` (bf16, fp16) run in fp32 on widened copies: this CPU has no oneDNN
// kernel for them (probed once per type). fp32: false.
bool ProductsEmulated(DType t);

// A 16-bit format's (`t`: kBF16 or kF16) `rows` rows of `width` elements, `ld` apart, widened
// exactly to fp32, and fp32 rows rounded to nearest even into it; what lies between rows is left
// alone. For callers that reuse a widened operand across products (the classifier).
void WidenRows(DType t, float* dst, size_t dst_ld, const void* src, size_t src_ld, int rows,
               int width);
void NarrowRows(DType t, void* dst, size_t dst_ld, const float* src, size_t src_ld, int rows,
                int width);

// `alpha` scales the product (not the bias): LoRA's s·h·Bᵀ.
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const float* bias, int M, int K, int N,
                   bool accumulate = false, float alpha = 1.0f);

// dinp (M,K) = alpha · dout · weight  (overwritten, or added with `accumulate`; skipped if null)
// dweight (N,K) += alpha · doutᵀ · inp (skipped if null: a frozen weight);
// dbias (N) += column sums of dout (skipped if null)
template <typename T>
void MatmulBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                    const T* weight, int M, int K, int N, float alpha = 1.0f,
                    bool accumulate = false);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS
