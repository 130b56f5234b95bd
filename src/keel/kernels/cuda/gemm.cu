// Matrix products through cuBLASLt, row-major in keel's convention (llm.c's shapes): a row-major
// C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so A and B swap places in the call.
// Biases (fp32) and their gradients are separate small kernels: cuBLASLt's bias epilogue wants
// the bias in the output's type for bf16 outputs on some versions, and keel keeps biases fp32.
#include <cstdlib>
#include <cstring>

#include "keel/core/error.h"
#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {
namespace {

cublasLtHandle_t Handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t x;
    KEEL_CUDA(cublasLtCreate(&x));
    return x;
  }();
  return h;
}

constexpr size_t kWorkspace = size_t(32) << 20;

bool Tf32() {
  static const bool on = [] {
    const char* s = std::getenv("KEEL_TF32");
    return s && std::strcmp(s, "1") == 0;
  }();
  return on;
}

// A row-major rows×cols matrix with leading dimension ld, as cuBLASLt's column-major cols×rows.
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout(cudaDataType t, int rows, int cols, int ld) {
    KEEL_CUDA(cublasLtMatrixLayoutCreate(&d, t, uint64_t(cols), uint64_t(rows), int64_t(ld)));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(d); }
};

}  // namespace

void Gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
          void* C, int ldc, DType ab, bool c_fp32, float alpha, float beta) {
  const cudaDataType abt = ab == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType ct = c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t compute =
      ab == DType::kF32 && Tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc;
  KEEL_CUDA(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  // Column-major: first operand B (N×K after op), second A (K×M after op).
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  KEEL_CUDA(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  KEEL_CUDA(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // Stored shapes, row-major: B is K×N (or N×K if tb), A is M×K (or K×M if ta), C is M×N.
  const Layout lb(abt, tb ? N : K, tb ? K : N, ldb);
  const Layout la(abt, ta ? K : M, ta ? M : K, lda);
  const Layout lc(ct, M, N, ldc);
  cublasLtMatmulPreference_t pref;
  KEEL_CUDA(cublasLtMatmulPreferenceCreate(&pref));
  KEEL_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &kWorkspace, sizeof kWorkspace));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  KEEL_CUDA(cublasLtMatmulAlgoGetHeuristic(Handle(), desc, lb.d, la.d, lc.d, lc.d, pref, 1, &heur,
                                           &found));
  if (found == 0)
    ThrowRuntime("cuBLASLt: no algorithm for a " + std::to_string(M) + "x" + std::to_string(N) +
                 "x" + std::to_string(K) + " product");
  KEEL_CUDA(cublasLtMatmul(Handle(), desc, &alpha, B, lb.d, A, la.d, &beta, C, lc.d, C, lc.d,
                           &heur.algo, Scratch(0, kWorkspace), kWorkspace, 0));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
}

void MatmulForward(DType t, void* out, const void* inp, const void* w, const float* bias, int M,
                   int K, int N, bool accumulate) {
  Gemm(false, true, M, N, K, inp, K, w, K, out, N, t, t == DType::kF32, 1.0f,
       accumulate ? 1.0f : 0.0f);
  if (bias) AddBias(t, out, bias, M, N);
}

void MatmulBackward(DType t, void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                    const void* w, int M, int K, int N) {
  if (dinp) Gemm(false, false, M, K, N, dout, N, w, K, dinp, K, t, t == DType::kF32, 1.0f, 0.0f);
  Gemm(true, false, N, K, M, dout, N, inp, K, dw, K, t, /*c_fp32=*/true, 1.0f, 1.0f);
  if (dbias) AddColumnSums(t, dbias, dout, M, N);
}

}  // namespace keel::kernels::cuda
