// Matrix products through cuBLASLt, row-major in keel's convention (llm.c's shapes): a row-major
// C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so A and B swap places in the call.
// Biases (fp32) and their gradients are separate small kernels (below): cuBLASLt's bias epilogue
// wants the bias in the output's type for bf16 outputs on some versions, and keel keeps biases
// fp32.
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>

#include "keel/core/error.h"
#include "keel/kernels/cuda/matmul.cuh"

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

// The largest power of two, up to 256, that divides p's address: cuBLASLt's heuristics assume
// 256-byte-aligned operands unless told, and a weight inside the flat layout may sit at any
// element.
uint32_t Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t x = 256;
  while (x > 1 && a % x) x /= 2;
  return x;
}

bool Tf32() {
  static const bool on = [] {
    const char* s = std::getenv("KEEL_TF32");
    return s && std::strcmp(s, "1") == 0;
  }();
  return on;
}

// One product shape's descriptors and algorithm, made once: the heuristic query costs tens of
// microseconds, a whole small product's time.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cublasLtMatrixLayout_t MakeLayout(cudaDataType t, int rows, int cols, int ld) {
  // A row-major rows×cols matrix with leading dimension ld is cuBLASLt's column-major cols×rows.
  cublasLtMatrixLayout_t d;
  KEEL_CUDA(cublasLtMatrixLayoutCreate(&d, t, uint64_t(cols), uint64_t(rows), int64_t(ld)));
  return d;
}

// p.algo: cuBLASLt's first choice for p's descriptors within kWorkspace, given the operands'
// alignments (cuBLASLt's A, B, C and D; 0: its default, 256 bytes).
void ChooseAlgo(Plan& p, int M, int N, int K, const char* what, uint32_t align_a = 0,
                uint32_t align_b = 0, uint32_t align_c = 0) {
  cublasLtMatmulPreference_t pref;
  KEEL_CUDA(cublasLtMatmulPreferenceCreate(&pref));
  KEEL_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &kWorkspace, sizeof kWorkspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
  for (const auto& [attr, bytes] : aligns)
    if (bytes) KEEL_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  KEEL_CUDA(cublasLtMatmulAlgoGetHeuristic(Handle(), p.desc, p.lb, p.la, p.lc, p.lc, pref, 1, &heur,
                                           &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0)
    ThrowRuntime(std::string("cuBLASLt: no ") + what + "algorithm for a " + std::to_string(M) +
                 "x" + std::to_string(N) + "x" + std::to_string(K) + " product");
  p.algo = heur.algo;
}

const Plan& PlanFor(bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc, DType ab,
                    bool c_fp32, uint32_t align_a, uint32_t align_b, uint32_t align_c) {
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, int, bool, bool, uint32_t,
                         uint32_t, uint32_t>;
  static std::map<Key, Plan> plans;
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, int(ab), c_fp32, Tf32(), align_a, align_b, align_c};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  const cudaDataType abt = ab == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType ct = c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t compute =
      ab == DType::kF32 && Tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Plan p;
  KEEL_CUDA(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  // Column-major: first operand B (N×K after op), second A (K×M after op).
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  KEEL_CUDA(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  KEEL_CUDA(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // Stored shapes, row-major: B is K×N (N×K if tb), A is M×K (K×M if ta), C is M×N.
  p.lb = MakeLayout(abt, tb ? N : K, tb ? K : N, ldb);
  p.la = MakeLayout(abt, ta ? K : M, ta ? M : K, lda);
  p.lc = MakeLayout(ct, M, N, ldc);
  // cuBLASLt's A is our B, its B our A; C and D are our C.
  ChooseAlgo(p, M, N, K, "", align_b, align_a, align_c);
  return plans.emplace(key, p).first->second;
}

// The fp8 products' plans (GemmFp8), apart: their types and scale pointers differ.
const Plan& PlanFp8(int M, int N, int K, bool p_e5m2, bool q_e5m2, bool c_fp32, const float* dp,
                    const float* dq, uint32_t align_c) {
  using Key = std::tuple<int, int, int, bool, bool, bool, const float*, const float*, uint32_t>;
  static std::map<Key, Plan> plans;
  const Key key{M, N, K, p_e5m2, q_e5m2, c_fp32, dp, dq, align_c};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  const cudaDataType pt = p_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  const cudaDataType qt = q_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  const cudaDataType ct = c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  Plan p;
  KEEL_CUDA(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major: cuBLASLt's A is Q (transposed: its K×N view), its B is P; fp8 takes only this.
  const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
  KEEL_CUDA(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  KEEL_CUDA(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  // The scales multiply the product: D = (1/s_q)·(1/s_p)·(Q·P) in cuBLASLt's terms.
  KEEL_CUDA(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dq, sizeof dq));
  KEEL_CUDA(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dp, sizeof dp));
  p.lb = MakeLayout(qt, N, K, K);  // our Q: as Plan's B (cuBLASLt's A)
  p.la = MakeLayout(pt, M, K, K);  // our P
  p.lc = MakeLayout(ct, M, N, N);
  // P and Q are scratch (256-byte aligned); C is wherever the caller's output is.
  ChooseAlgo(p, M, N, K, "fp8 ", 256, 256, align_c);
  return plans.emplace(key, p).first->second;
}

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void AddBiasKernel(T* out, const float* bias, int M, int N) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size_t(M) * N) St(out, i, Ld(out, i) + bias[i % N]);
}

template <typename T>
__global__ void ColumnPartials(float* partial, const T* d, int M, int N) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= N) return;
  const int per = (M + kRowBlocks - 1) / kRowBlocks;
  float s = 0.0f;
  for (int r = k * per; r < min(M, (k + 1) * per); ++r) s += Ld(d, size_t(r) * N + c);
  partial[size_t(kRowBlocks + k) * N + c] = s;
}

__global__ void AddColumnPartials(float* dbias, const float* partial, int N) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= N) return;
  float s = 0.0f;
  for (int k = 0; k < kRowBlocks; ++k) s += partial[size_t(kRowBlocks + k) * N + c];
  dbias[c] += s;
}

}  // namespace

// out (M,N) += bias (N) fp32.
void AddBias(DType t, void* out, const float* bias, int M, int N, cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(
      t, size_t(M) * N, kThreads,
      (AddBiasKernel<U><<<blocks, kThreads, 0, stream>>>(static_cast<U*>(out), bias, M, N)));
}

// dbias (N) += Σ rows of d (M,N), in a fixed order.
void AddColumnSums(DType t, float* dbias, const void* d, int M, int N, cudaStream_t stream) {
  float* partial =
      static_cast<float*>(Scratch(7, sizeof(float) * 2 * kRowBlocks * size_t(N), stream));
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    ColumnPartials<U><<<dim3(Blocks(size_t(N), 256), kRowBlocks), 256, 0, stream>>>(
        partial, static_cast<const U*>(d), M, N);
  });
  AddColumnPartials<<<Blocks(size_t(N), 256), 256, 0, stream>>>(dbias, partial, N);
  KEEL_CUDA(cudaGetLastError());
}

void Gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
          void* C, int ldc, DType ab, bool c_fp32, float alpha, float beta, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  const Plan& p =
      PlanFor(ta, tb, M, N, K, lda, ldb, ldc, ab, c_fp32, Alignment(A), Alignment(B), Alignment(C));
  KEEL_CUDA(cublasLtMatmul(Handle(), p.desc, &alpha, B, p.lb, A, p.la, &beta, C, p.lc, C, p.lc,
                           &p.algo, Scratch(0, kWorkspace, stream), kWorkspace, stream));
}

void GemmFp8(int M, int N, int K, const void* P, bool p_e5m2, const void* Q, bool q_e5m2,
             const float* dp, const float* dq, void* C, bool c_fp32, float beta,
             cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  if (Alignment(C) < 16) ThrowRuntime("cuBLASLt fp8: the output must be 16-byte aligned");
  const Plan& p = PlanFp8(M, N, K, p_e5m2, q_e5m2, c_fp32, dp, dq, Alignment(C));
  const float alpha = 1.0f;
  KEEL_CUDA(cublasLtMatmul(Handle(), p.desc, &alpha, Q, p.lb, P, p.la, &beta, C, p.lc, C, p.lc,
                           &p.algo, Scratch(0, kWorkspace, stream), kWorkspace, stream));
}

void MatmulForward(DType t, void* out, const void* inp, const void* w, const float* bias, int M,
                   int K, int N, bool accumulate, float alpha, cudaStream_t stream) {
  Gemm(false, true, M, N, K, inp, K, w, K, out, N, t, t == DType::kF32, alpha,
       accumulate ? 1.0f : 0.0f, stream);
  if (bias) AddBias(t, out, bias, M, N, stream);
}

void MatmulBackward(DType t, void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                    const void* w, int M, int K, int N, float alpha, bool accumulate,
                    cudaStream_t stream) {
  if (dinp)
    Gemm(false, false, M, K, N, dout, N, w, K, dinp, K, t, t == DType::kF32, alpha,
         accumulate ? 1.0f : 0.0f, stream);
  if (dw)
    Gemm(true, false, N, K, M, dout, N, inp, K, dw, K, t, /*c_fp32=*/true, alpha, 1.0f, stream);
  if (dbias) AddColumnSums(t, dbias, dout, M, N, stream);
}

}  // namespace keel::kernels::cuda
