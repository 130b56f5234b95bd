// Matrix products through oneDNN's matmul primitive.
//
// Why oneDNN and not our own micro-kernels: Debian's oneDNN 2.6 reaches 76-95% of this CPU's
// fp32 and bf16 peaks on GPT-2 shapes (brgemm with avx512_core_bf16), handles transposes and
// strides through memory descriptors, and fuses the bias and the "+= into C" we need. Creating a
// primitive costs ~100 µs, so each distinct shape is created once and cached.
//
// Legend: M rows of the input (B*T), K input features, N output features.
#include "keel/kernels/matmul.h"

#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/core/error.h"

namespace keel::kernels {
namespace {

dnnl::memory::data_type DnnlType(DType t) {
  return t == DType::kF32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

Engine& GetEngine() {
  static Engine e;
  return e;
}

struct CachedGemm {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
};

std::string Key(const GemmArgs& g) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%d%d|%d,%d,%d|%d,%d,%d|%d%d|%g,%g|%d", g.trans_a, g.trans_b, g.M,
                g.N, g.K, g.lda, g.ldb, g.ldc, int(g.ab_type), int(g.c_type), g.alpha, g.beta,
                g.bias != nullptr);
  return buf;
}

CachedGemm Create(const GemmArgs& g) {
  using dims = dnnl::memory::dims;
  const dnnl::memory::dim M = g.M, N = g.N, K = g.K;
  // Row-major op(A) (M,K): A itself is (M,K) with row stride lda, or (K,M) read transposed.
  dnnl::memory::desc a({M, K}, DnnlType(g.ab_type), g.trans_a ? dims{1, g.lda} : dims{g.lda, 1});
  dnnl::memory::desc b({K, N}, DnnlType(g.ab_type), g.trans_b ? dims{1, g.ldb} : dims{g.ldb, 1});
  dnnl::memory::desc c({M, N}, DnnlType(g.c_type), dims{g.ldc, 1});
  dnnl::memory::desc bias;
  if (g.bias) bias = dnnl::memory::desc({1, N}, dnnl::memory::data_type::f32, dims{N, 1});
  dnnl::primitive_attr attr;
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  auto pd =
      g.bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), attr,
                                            GetEngine().engine)
             : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, GetEngine().engine);
  return {dnnl::matmul(pd), a, b, c, bias};
}

// Output rows whose stride is a multiple of 4 KiB alias in the cache's sets, and oneDNN 2.6's
// brgemm then runs at a third of its speed (GPT-2's 4·768-float rows: 104 → 296 GFLOP/s fp32 for
// the MLP's input gradient). Such products write into a scratch with rows padded by 64 bytes and
// copy out, which costs ~2 ms per 12 MB.
bool AliasingStride(int ld, DType t) { return (size_t(ld) * DTypeSize(t)) % 4096 == 0; }

void CopyRows(void* dst, size_t dst_ld, const void* src, size_t src_ld, int rows,
              size_t row_bytes) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_ld, static_cast<const char*>(src) + r * src_ld,
                row_bytes);
}

void GemmDirect(const GemmArgs& g) {
  KEEL_CHECK(g.beta == 0.0f || g.beta == 1.0f, "Gemm: beta must be 0 or 1");
  KEEL_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "Gemm: empty product");
  static std::mutex mu;
  static std::unordered_map<std::string, CachedGemm> cache;
  const CachedGemm* cg;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto key = Key(g);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, Create(g)).first;
    cg = &it->second;
  }
  auto& e = GetEngine();
  dnnl::memory a(cg->a, e.engine, const_cast<void*>(g.A));
  dnnl::memory b(cg->b, e.engine, const_cast<void*>(g.B));
  dnnl::memory c(cg->c, e.engine, g.C);
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (g.bias)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(cg->bias, e.engine, const_cast<float*>(g.bias)));
  cg->prim.execute(e.stream, args);
  e.stream.wait();
}

}  // namespace

void Gemm(const GemmArgs& g) {
  // Only fp32 products are slow enough for the copy to pay; AMX bf16 ones are not.
  if (g.ab_type != DType::kF32 || !AliasingStride(g.ldc, g.c_type) || g.M < 64)
    return GemmDirect(g);
  thread_local std::vector<char> scratch;
  const size_t es = DTypeSize(g.c_type);
  const int padded_ld = g.ldc + int(64 / es);
  const size_t row_bytes = size_t(g.N) * es;
  if (scratch.size() < size_t(g.M) * padded_ld * es) scratch.resize(size_t(g.M) * padded_ld * es);
  if (g.beta != 0.0f) CopyRows(scratch.data(), padded_ld * es, g.C, g.ldc * es, g.M, row_bytes);
  GemmArgs p = g;
  p.C = scratch.data();
  p.ldc = padded_ld;
  GemmDirect(p);
  CopyRows(g.C, g.ldc * es, scratch.data(), padded_ld * es, g.M, row_bytes);
}

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const float* bias, int M, int K, int N,
                   bool accumulate) {
  GemmArgs g;
  g.trans_b = true;
  g.M = M, g.N = N, g.K = K;
  g.A = inp, g.lda = K;
  g.B = weight, g.ldb = K;
  g.C = out, g.ldc = N;
  g.ab_type = g.c_type = DTypeOf<T>();
  g.beta = accumulate ? 1.0f : 0.0f;
  g.bias = bias;
  Gemm(g);
}

template <typename T>
void MatmulBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                    const T* weight, int M, int K, int N) {
  if (dinp) {
    GemmArgs g;
    g.M = M, g.N = K, g.K = N;
    g.A = dout, g.lda = N;
    g.B = weight, g.ldb = K;
    g.C = dinp, g.ldc = K;
    g.ab_type = g.c_type = DTypeOf<T>();
    Gemm(g);
  }
  {
    GemmArgs g;
    g.trans_a = true;
    g.M = N, g.N = K, g.K = M;
    g.A = dout, g.lda = N;
    g.B = inp, g.ldb = K;
    g.C = dweight, g.ldc = K;
    g.ab_type = DTypeOf<T>();
    g.c_type = DType::kF32;
    g.beta = 1.0f;
    Gemm(g);
  }
  if (dbias) {
    // Threads split the columns and each sums its rows in order: the same bits whatever the
    // thread count.
    constexpr int kCols = 64;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < N; c0 += kCols) {
      int c1 = std::min(N, c0 + kCols);
      float acc[kCols] = {};
      for (int m = 0; m < M; ++m) {
        const T* row = dout + size_t(m) * N;
#pragma omp simd
        for (int c = c0; c < c1; ++c) acc[c - c0] += ToFloat(row[c]);
      }
      for (int c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

template void MatmulForward<float>(float*, const float*, const float*, const float*, int, int, int,
                                   bool);
template void MatmulForward<bf16>(bf16*, const bf16*, const bf16*, const float*, int, int, int,
                                  bool);
template void MatmulBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, int, int, int);
template void MatmulBackward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                   int, int, int);

}  // namespace keel::kernels
