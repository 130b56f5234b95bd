// Matrix products through oneDNN's matmul primitive.
//
// Why oneDNN and not our own micro-kernels: Debian's oneDNN 2.6 reaches 76-95% of this CPU's
// fp32 and bf16 peaks on GPT-2 shapes (brgemm with avx512_core_bf16), handles transposes and
// strides through memory descriptors, and fuses the bias and the "+= into C" we need. Creating a
// primitive costs ~100 µs, so each distinct shape is created once and cached.
//
// bf16 on CPUs without AVX-512 (e.g. AVX2-only AMD EPYC, where CI runs): oneDNN 2.6 has no bf16
// matmul there at all, not even a reference one ("could not create a primitive descriptor
// iterator"). The first bf16 product that fails to create marks bf16 GEMM unsupported for the
// process (one line to stderr), and from then on bf16 products widen A and B to fp32 scratch,
// run the fp32 product and round C back to bf16 (nearest even). bf16 values are exact in fp32,
// so this is the same math as a bf16 product with fp32 accumulation, only slower. CPUs that can
// run bf16 keep the direct path.
//
// Legend: M rows of the input (B*T), K input features, N output features.
#include "keel/kernels/cpu/matmul.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "keel/core/error.h"
#include "keel/kernels/cpu/scratch.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
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

// Set once the CPU has refused a bf16 product: from then on bf16 products run in fp32.
std::atomic<bool> bf16_unsupported{false};

// Kernels print nothing (callers parse their tools' output); the trainer reports it once.
void MarkBf16Unsupported() { bf16_unsupported.store(true); }

// Returns false, creating nothing, if the CPU has no bf16 product for a bf16 `g`.
bool GemmDirect(const GemmArgs& g) {
  KEEL_CHECK(g.beta == 0.0f || g.beta == 1.0f, "Gemm: beta must be 0 or 1");
  KEEL_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "Gemm: empty product");
  static std::mutex mu;
  static std::unordered_map<std::string, CachedGemm> cache;
  const CachedGemm* cg;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto key = Key(g);
    auto it = cache.find(key);
    if (it == cache.end()) {
      try {
        it = cache.emplace(key, Create(g)).first;
      } catch (const dnnl::error&) {
        if (g.ab_type != DType::kBF16) throw;
        MarkBf16Unsupported();
        return false;
      }
    }
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
  return true;
}

// Conversions of `rows` rows of `width` elements, `ld` apart; what lies between rows is left
// alone. Threads split the rows once there is enough work to pay for them.
constexpr size_t kParallelElems = size_t(1) << 15;

template <typename D, typename S, typename Convert>
void ConvertRows(D* dst, size_t dst_ld, const S* src, size_t src_ld, int rows, int width,
                 Convert convert) {
#pragma omp parallel for schedule(static) if (size_t(rows) * width >= kParallelElems)
  for (int r = 0; r < rows; ++r) {
    D* d = dst + r * dst_ld;
    const S* s = src + r * src_ld;
#pragma omp simd
    for (int i = 0; i < width; ++i) d[i] = convert(s[i]);
  }
}

// A 16-bit format's (`t`: kBF16 or kF16) rows widened to fp32, and fp32 rows rounded to it.
void WidenRows(DType t, float* dst, size_t dst_ld, const void* src, size_t src_ld, int rows,
               int width) {
  if (t == DType::kF16)
    return ConvertRows(dst, dst_ld, static_cast<const f16*>(src), src_ld, rows, width,
                       [](f16 x) { return ToFloat(x); });
  ConvertRows(dst, dst_ld, static_cast<const bf16*>(src), src_ld, rows, width,
              [](bf16 x) { return ToFloat(x); });
}

void NarrowRows(DType t, void* dst, size_t dst_ld, const float* src, size_t src_ld, int rows,
                int width) {
  if (t == DType::kF16)
    return ConvertRows(static_cast<f16*>(dst), dst_ld, src, src_ld, rows, width,
                       [](float x) { return ToF16(x); });
  ConvertRows(static_cast<bf16*>(dst), dst_ld, src, src_ld, rows, width,
              [](float x) { return ToBf16(x); });
}

// A 16-bit (`t`) operand as stored: `rows` rows of `width` elements, `ld` apart, widened into
// `scratch` with the same ld (only the strided region (rows-1)·ld + width is touched).
const float* WidenOperand(AlignedScratch<float>& scratch, DType t, const void* x, int ld, int rows,
                          int width) {
  float* wide = scratch.Get(size_t(rows - 1) * ld + width);
  WidenRows(t, wide, ld, x, ld, rows, width);
  return wide;
}

void GemmNative(const GemmArgs& g);

// A 16-bit product run in fp32: bf16 on a CPU without a bf16 product, and fp16 everywhere (no
// oneDNN f16 product here but on AVX512-FP16). The inputs are exact in fp32, the accumulation is
// fp32 and C is rounded to nearest even, as a native product would.
void Gemm16ViaF32(const GemmArgs& g) {
  KEEL_CHECK(g.beta == 0.0f || g.beta == 1.0f, "Gemm: beta must be 0 or 1");
  KEEL_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "Gemm: empty product");
  thread_local AlignedScratch<float> a_buf, b_buf, c_buf;
  GemmArgs p = g;
  p.ab_type = p.c_type = DType::kF32;
  // Stored shapes: A is (M,K), or (K,M) if transposed; B is (K,N), or (N,K) if transposed.
  const DType t = g.ab_type;
  p.A = g.trans_a ? WidenOperand(a_buf, t, g.A, g.lda, g.K, g.M)
                  : WidenOperand(a_buf, t, g.A, g.lda, g.M, g.K);
  p.B = g.trans_b ? WidenOperand(b_buf, t, g.B, g.ldb, g.N, g.K)
                  : WidenOperand(b_buf, t, g.B, g.ldb, g.K, g.N);
  if (g.c_type == DType::kF32) return GemmNative(p);
  float* c = c_buf.Get(size_t(g.M) * g.N);
  p.C = c;
  p.ldc = g.N;
  if (g.beta != 0.0f) WidenRows(t, c, g.N, g.C, g.ldc, g.M, g.N);
  GemmNative(p);
  NarrowRows(t, g.C, g.ldc, c, g.N, g.M, g.N);
}

// Products the CPU runs as they are (fp32 always; bf16 where oneDNN has a kernel for it).
void GemmNative(const GemmArgs& g) {
  // Only fp32 products are slow enough for the copy to pay; AMX bf16 ones are not.
  if (g.ab_type != DType::kF32 || !AliasingStride(g.ldc, g.c_type) || g.M < 64) {
    if (!GemmDirect(g)) Gemm16ViaF32(g);
    return;
  }
  thread_local AlignedScratch<char> scratch;
  const size_t es = DTypeSize(g.c_type);
  const int padded_ld = g.ldc + int(64 / es);
  const size_t row_bytes = size_t(g.N) * es;
  char* padded = scratch.Get(size_t(g.M) * padded_ld * es);
  if (g.beta != 0.0f) CopyRows(padded, padded_ld * es, g.C, g.ldc * es, g.M, row_bytes);
  GemmArgs p = g;
  p.C = padded;
  p.ldc = padded_ld;
  GemmDirect(p);
  CopyRows(g.C, g.ldc * es, padded, padded_ld * es, g.M, row_bytes);
}

}  // namespace

bool Bf16ProductsEmulated() { return bf16_unsupported.load(std::memory_order_relaxed); }

void Gemm(const GemmArgs& g) {
  if (g.ab_type == DType::kF16 ||
      (g.ab_type == DType::kBF16 && bf16_unsupported.load(std::memory_order_relaxed)))
    return Gemm16ViaF32(g);
  GemmNative(g);
}

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const float* bias, int M, int K, int N,
                   bool accumulate, float alpha) {
  GemmArgs g;
  g.alpha = alpha;
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
                    const T* weight, int M, int K, int N, float alpha, bool accumulate) {
  if (dinp) {
    GemmArgs g;
    g.alpha = alpha;
    g.beta = accumulate ? 1.0f : 0.0f;
    g.M = M, g.N = K, g.K = N;
    g.A = dout, g.lda = N;
    g.B = weight, g.ldb = K;
    g.C = dinp, g.ldc = K;
    g.ab_type = g.c_type = DTypeOf<T>();
    Gemm(g);
  }
  if (dweight) {
    GemmArgs g;
    g.alpha = alpha;
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
                                   bool, float);
template void MatmulForward<bf16>(bf16*, const bf16*, const bf16*, const float*, int, int, int,
                                  bool, float);
template void MatmulForward<f16>(f16*, const f16*, const f16*, const float*, int, int, int, bool,
                                 float);
template void MatmulBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, int, int, int, float, bool);
template void MatmulBackward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                   int, int, int, float, bool);
template void MatmulBackward<f16>(f16*, float*, float*, const f16*, const f16*, const f16*, int,
                                  int, int, float, bool);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS
