// Matrix products through oneDNN's matmul primitive.
//
// Why oneDNN and not our own micro-kernels: Debian's oneDNN 2.6 reaches 76-95% of this CPU's
// fp32 and bf16 peaks on GPT-2 shapes (brgemm with avx512_core_bf16), handles transposes and
// strides through memory descriptors, and fuses the bias and the "+= into C" we need. Creating a
// primitive costs ~100 µs, so each distinct shape is created once and cached.
//
// 16-bit products where oneDNN has no kernel for them: bf16 on CPUs without AVX-512 (e.g.
// AVX2-only AMD EPYC, where CI runs; oneDNN 2.6 has no bf16 matmul there at all, "could not
// create a primitive descriptor iterator"), and fp16 everywhere but AVX512-FP16 and AMX-FP16
// CPUs (Sapphire Rapids and later). A probe product per type, created once, says which; a type
// refused there (or offered only oneDNN's reference kernel, slower than widening) widens A and B
// to fp32 scratch, runs the fp32 product and rounds C back (nearest even). Both formats are exact
// in fp32, so this is the same math as a 16-bit product with fp32 accumulation, only slower. A
// single shape refused later (a transpose or a post-op the probe has not) widens alone, every
// time, so that a resumed run takes the uninterrupted one's paths.
//
// Legend: M rows of the input (B*T), K input features, N output features.
#include "keel/kernels/cpu/matmul.h"

#include <atomic>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "keel/core/error.h"
#include "keel/kernels/cpu/scratch.h"
#include "keel/kernels/cpu_isa.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

dnnl::memory::data_type DnnlType(DType t) {
  return t == DType::kF32   ? dnnl::memory::data_type::f32
         : t == DType::kF16 ? dnnl::memory::data_type::f16
                            : dnnl::memory::data_type::bf16;
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
  std::string kernel;  // oneDNN's name for the implementation
};

std::string Key(const GemmArgs& g) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%d%d|%d,%d,%d|%d,%d,%d|%d%d|%g,%g|%d", g.trans_a, g.trans_b, g.M,
                g.N, g.K, g.lda, g.ldb, g.ldc, int(g.ab_type), int(g.c_type), g.alpha, g.beta,
                g.bias != nullptr);
  return buf;
}

// oneDNN 2.6's matmul offers its brgemm kernel first, but for two kinds of fp32 product its older
// gemm kernel ("gemm:jit", the one behind dnnl_sgemm) is faster (AMX-hidden Sapphire Rapids, 2
// threads, bench/gemm_kernels.cc):
// - no transposes, the input gradients' form: GPT-2 124M's 4-12% faster (qkv's 141-144 → 130-131
//   ms a step); the classifier's, in 8,192-column chunks, runs as fast either way;
// - output rows whose stride is a multiple of 4 KiB (GPT-2's 4·768-float hidden rows): brgemm's
//   partial sums alias in the cache's sets and it runs at a third of its speed (104 vs 296
//   GFLOP/s for the MLP's input gradient), gemm:jit does not. Before, such products wrote into a
//   scratch with padded rows and copied out (~45 ms of a 124M step).
// Elsewhere (a transposed operand, other strides) brgemm is as fast or faster (124M's MLP
// projection forward 188 vs 201 ms a step).
bool AliasingStride(int ld, DType t) { return (size_t(ld) * DTypeSize(t)) % 4096 == 0; }

bool PreferJitGemm(const GemmArgs& g) {
  return g.ab_type == DType::kF32 &&
         ((!g.trans_a && !g.trans_b) || AliasingStride(g.ldc, g.c_type));
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
  // The iterator behind a primitive descriptor keeps a pointer to the operation's descriptor: it
  // must outlive the walk below.
  const dnnl::matmul::desc op =
      g.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  auto make = [&] { return dnnl::matmul::primitive_desc(op, attr, GetEngine().engine); };
  auto pd = make();
  if (PreferJitGemm(g)) {
    // The iterator is shared by copies of a descriptor: walk a second one.
    for (auto alt = make();;) {
      if (std::string(alt.impl_info_str()).rfind("gemm:", 0) == 0) {
        pd = alt;
        break;
      }
      if (!alt.next_impl()) break;
    }
  }
  // A 16-bit type with only the reference kernel is slower than widening it: treated as refused.
  if (g.ab_type != DType::kF32 && std::string(pd.impl_info_str()).rfind("ref", 0) == 0)
    throw dnnl::error(dnnl_unimplemented, "only a reference 16-bit matmul");
  return {dnnl::matmul(pd), a, b, c, bias, pd.impl_info_str()};
}

// Set once the CPU has refused a product of the type (bf16, fp16): from then on they run in fp32.
std::atomic<bool> refused[2] = {false, false};
std::atomic<bool>& Refused(DType t) { return refused[t == DType::kF16 ? 1 : 0]; }

// Kernels print nothing (callers parse their tools' output); the trainer reports it once.
void MarkRefused(DType t) { Refused(t).store(true); }

bool GemmDirect(const GemmArgs& g);

// The probe: one small product of the type, created (and cached) at the first product of it.
// Only the probe decides for the whole type; a shape refused later widens alone (GemmDirect).
// bf16 products widen also where the CPU's bf16 instruction is slower than its FMA (cpu_isa.h).
bool Native(DType t) {
  static std::once_flag once[2];
  std::call_once(once[t == DType::kF16 ? 1 : 0], [t] {
    std::vector<uint16_t> a(64 * 64), c(64 * 64);  // zeros: the product is discarded
    GemmArgs g;
    g.M = g.N = g.K = 64;
    g.A = a.data(), g.B = a.data(), g.C = c.data();
    g.lda = g.ldb = g.ldc = 64;
    g.ab_type = g.c_type = t;
    if ((t == DType::kBF16 && Bf16ProductsInFp32()) || !GemmDirect(g)) MarkRefused(t);
  });
  return !Refused(t).load(std::memory_order_relaxed);
}

// The product for `g`'s shape, created at its first use; null if the CPU has none for a 16-bit
// `g`. The refusal is kept, so that the shape takes the same path every time.
const CachedGemm* Lookup(const GemmArgs& g) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::optional<CachedGemm>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = Key(g);
  auto it = cache.find(key);
  if (it == cache.end()) {
    try {
      it = cache.emplace(key, Create(g)).first;
    } catch (const dnnl::error&) {
      if (g.ab_type == DType::kF32) throw;
      it = cache.emplace(key, std::nullopt).first;
    }
  }
  return it->second ? &*it->second : nullptr;
}

// Returns false, running nothing, if the CPU has no product for a 16-bit `g`'s shape.
bool GemmDirect(const GemmArgs& g) {
  KEEL_CHECK(g.beta == 0.0f || g.beta == 1.0f, "Gemm: beta must be 0 or 1");
  KEEL_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "Gemm: empty product");
  const CachedGemm* cg = Lookup(g);
  if (!cg) return false;
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

// A 16-bit (`t`) operand as stored: `rows` rows of `width` elements, `ld` apart, widened into
// `scratch` with the same ld (only the strided region (rows-1)·ld + width is touched).
const float* WidenOperand(AlignedScratch<float>& scratch, DType t, const void* x, int ld, int rows,
                          int width) {
  float* wide = scratch.Get(size_t(rows - 1) * ld + width);
  WidenRows(t, wide, ld, x, ld, rows, width);
  return wide;
}

void GemmNative(const GemmArgs& g);

// A 16-bit product run in fp32, on a CPU without a product of its type (above). The inputs are
// exact in fp32, the accumulation is fp32 and C is rounded to nearest even, as a native product
// would.
// `wide_a`, if given, is A already widened (same layout): a caller that reads one operand in two
// products widens it once.
void Gemm16ViaF32(const GemmArgs& g, const float* wide_a = nullptr) {
  KEEL_CHECK(g.beta == 0.0f || g.beta == 1.0f, "Gemm: beta must be 0 or 1");
  KEEL_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "Gemm: empty product");
  thread_local AlignedScratch<float> a_buf, b_buf, c_buf;
  GemmArgs p = g;
  p.ab_type = p.c_type = DType::kF32;
  // Stored shapes: A is (M,K), or (K,M) if transposed; B is (K,N), or (N,K) if transposed.
  const DType t = g.ab_type;
  p.A = wide_a      ? wide_a
        : g.trans_a ? WidenOperand(a_buf, t, g.A, g.lda, g.K, g.M)
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

// Products the CPU runs as they are (fp32 always; bf16 and fp16 where oneDNN has a kernel).
void GemmNative(const GemmArgs& g) {
  if (!GemmDirect(g)) Gemm16ViaF32(g);
}

}  // namespace

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

bool ProductsEmulated(DType t) { return t != DType::kF32 && !Native(t); }

void Gemm(const GemmArgs& g) {
  if (ProductsEmulated(g.ab_type)) return Gemm16ViaF32(g);
  GemmNative(g);
}

std::string GemmKernel(const GemmArgs& g) {
  const CachedGemm* cg = ProductsEmulated(g.ab_type) ? nullptr : Lookup(g);
  return cg ? cg->kernel : "widened to fp32";
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
  // Where 16-bit products run in fp32, both read dout (M,N): widened once, not per product (about
  // a fifth of what the widening moves in GPT-2's backward).
  const float* wide_dout = nullptr;
  if (!std::is_same_v<T, float> && dinp && dweight && ProductsEmulated(DTypeOf<T>())) {
    thread_local AlignedScratch<float> buf;
    wide_dout = WidenOperand(buf, DTypeOf<T>(), dout, N, M, N);
  }
  auto gemm = [&](const GemmArgs& g) { wide_dout ? Gemm16ViaF32(g, wide_dout) : Gemm(g); };
  if (dinp) {
    GemmArgs g;
    g.alpha = alpha;
    g.beta = accumulate ? 1.0f : 0.0f;
    g.M = M, g.N = K, g.K = N;
    g.A = dout, g.lda = N;
    g.B = weight, g.ldb = K;
    g.C = dinp, g.ldc = K;
    g.ab_type = g.c_type = DTypeOf<T>();
    gemm(g);
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
    gemm(g);
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
