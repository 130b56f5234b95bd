// The classifier fused with cross-entropy in vocabulary chunks (contract: cpu/classifier.h): each
// chunk's logits (M × chunk, fp32) come from one cuBLASLt product into scratch, and per-row
// kernels fold them into a running max and sum (forward) or turn them into the softmax's
// gradient (backward, a second pass with the final log-sum-exp), which two more products send
// into dx and dwte. Only one chunk of logits exists at a time; where the whole vocabulary's fit
// the memory budget (an eighth of the GPU's free memory, at most 4 GiB), there is one chunk and
// the backward reuses the forward's logits instead of recomputing them.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "keel/kernels/cuda/classifier.cuh"
#include "keel/kernels/cuda/matmul.cuh"

namespace keel::kernels::cuda {
namespace {

// The logits one chunk may take: an eighth of the free memory when first asked, within
// [256 MiB, 4 GiB].
size_t ChunkBytes() {
  static const size_t bytes = [] {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) free = 0;
    return std::clamp(free / 8, size_t(256) << 20, size_t(4) << 30);
  }();
  return bytes;
}

__global__ void InitStats(float* mx, float* sum, float* tl, int M) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  mx[r] = -INFINITY;
  sum[r] = 0.0f;
  tl[r] = 0.0f;
}

// One warp per row: merge the chunk [v0, v0 + n) into the row's running max and sum.
__global__ void FoldChunk(float* mx, float* sum, float* tl, const float* logits, int ld,
                          const int32_t* targets, int M, int v0, int n) {
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= M) return;
  const float* row = logits + size_t(r) * ld;
  float m = -INFINITY;
  for (int c = lane; c < n; c += 32) m = fmaxf(m, row[c]);
  m = WarpMax(m);
  float s = 0.0f;
  for (int c = lane; c < n; c += 32) s += __expf(row[c] - m);
  s = WarpSum(s);
  if (lane != 0) return;
  const float M0 = fmaxf(mx[r], m);
  sum[r] = sum[r] * __expf(mx[r] - M0) + s * __expf(m - M0);
  mx[r] = M0;
  const int t = targets[r];
  if (t >= v0 && t < v0 + n) tl[r] = row[t - v0];
}

// losses = lse − target logit (0 where the target is negative); mx ← lse for the backward pass.
__global__ void Losses(float* losses, float* mx, const float* sum, const float* tl,
                       const int32_t* targets, int M) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  const float lse = mx[r] + logf(sum[r]);
  mx[r] = lse;
  losses[r] = targets[r] < 0 ? 0.0f : lse - tl[r];
}

// g = dloss·(softmax − onehot(target)) for the chunk, in the product's input type.
template <typename T>
__global__ void SoftmaxGrad(T* g, const float* logits, int ld, const float* lse,
                            const int32_t* targets, float dloss, int M, int v0, int n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(M) * n) return;
  const int r = int(i / n), c = int(i % n), t = targets[r];
  const float p = __expf(logits[size_t(r) * ld + c] - lse[r]);
  St(g, size_t(r) * ld + c, t < 0 ? 0.0f : dloss * (p - (t == v0 + c ? 1.0f : 0.0f)));
}

template <typename T>
__global__ void FromF32(T* out, const float* in, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) St(out, i, in[i]);
}

// Vocabulary columns per chunk, a multiple of 128 (the logits' rows stay aligned for cuBLASLt).
int ChunkOf(int M, int V) {
  const size_t fit = ChunkBytes() / (sizeof(float) * size_t(M));
  const size_t whole = (size_t(V) + 127) / 128 * 128;
  return int(std::max<size_t>(128, std::min(whole, fit / 128 * 128)));
}

}  // namespace

void Classifier(DType t, float* losses, void* dx, float* dwte, const void* x, const void* wte,
                const int32_t* targets, float dloss, int M, int C, int V, int /*Vp*/,
                cudaStream_t stream) {
  const int chunk = ChunkOf(M, V);
  const size_t es = DTypeSize(t);
  float* logits = static_cast<float*>(Scratch(1, sizeof(float) * size_t(M) * chunk, stream));
  float* stats = static_cast<float*>(Scratch(2, sizeof(float) * 3 * size_t(M), stream));
  float *mx = stats, *sum = stats + M, *tl = stats + 2 * size_t(M);
  const char* w = static_cast<const char*>(wte);
  InitStats<<<Blocks(size_t(M), 256), 256, 0, stream>>>(mx, sum, tl, M);
  for (int v0 = 0; v0 < V; v0 += chunk) {
    const int n = std::min(chunk, V - v0);
    Gemm(false, true, M, n, C, x, C, w + size_t(v0) * C * es, C, logits, chunk, t, true, 1, 0,
         stream);
    FoldChunk<<<Blocks(size_t(M), 8), 256, 0, stream>>>(mx, sum, tl, logits, chunk, targets, M, v0,
                                                        n);
  }
  Losses<<<Blocks(size_t(M), 256), 256, 0, stream>>>(losses, mx, sum, tl, targets, M);
  KEEL_CUDA(cudaGetLastError());
  if (!dx) return;
  float* dx32 = static_cast<float*>(Scratch(3, sizeof(float) * size_t(M) * C, stream));
  KEEL_CUDA(cudaMemsetAsync(dx32, 0, sizeof(float) * size_t(M) * C, stream));
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    // bf16: the gradient tile in bf16 for the products; fp32: in place of the logits.
    U* g = t == DType::kF32 ? reinterpret_cast<U*>(logits)
                            : static_cast<U*>(Scratch(8, sizeof(U) * size_t(M) * chunk, stream));
    for (int v0 = 0; v0 < V; v0 += chunk) {
      const int n = std::min(chunk, V - v0);
      const void* wc = w + size_t(v0) * C * es;
      if (chunk < V)  // else the forward's logits are still there
        Gemm(false, true, M, n, C, x, C, wc, C, logits, chunk, t, true, 1, 0, stream);
      SoftmaxGrad<U><<<Blocks(size_t(M) * n, 256), 256, 0, stream>>>(g, logits, chunk, mx, targets,
                                                                     dloss, M, v0, n);
      Gemm(false, false, M, C, n, g, chunk, wc, C, dx32, C, t, true, 1, 1, stream);
      if (dwte)
        Gemm(true, false, n, C, M, g, chunk, x, C, dwte + size_t(v0) * C, C, t, true, 1, 1, stream);
    }
    FromF32<U>
        <<<Blocks(size_t(M) * C, 256), 256, 0, stream>>>(static_cast<U*>(dx), dx32, size_t(M) * C);
  });
  KEEL_CUDA(cudaGetLastError());
}

void ClassifierLogits(DType t, float* logits, const void* x, const void* wte, int M, int C, int V,
                      cudaStream_t stream) {
  Gemm(false, true, M, V, C, x, C, wte, C, logits, V, t, true, 1, 0, stream);
}

}  // namespace keel::kernels::cuda
