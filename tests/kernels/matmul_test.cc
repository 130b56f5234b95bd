// Matmul and the fused classifier loss against float64 references and finite differences.
#include "keel/kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "determinism.h"
#include "fd_check.h"
#include "keel/kernels/cpu/classifier.h"
#include "keel/kernels/cpu/vec_math.h"
#include "keel/kernels/cpu_isa.h"

namespace keel::kernels::cpu {
namespace {

using test::MaxRelError;
using test::NumericalGradient;
using test::RandomVector;
using test::RoundTrip;
using test::ToDouble;
using test::ToTyped;

// out = inp·Wᵀ + bias, float64.
std::vector<double> RefLinear(const std::vector<double>& inp, const std::vector<double>& w,
                              const std::vector<double>& b, int M, int K, int N) {
  std::vector<double> out(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = b.empty() ? 0 : b[n];
      for (int k = 0; k < K; ++k) s += inp[m * K + k] * w[n * K + k];
      out[m * N + n] = s;
    }
  return out;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
void CheckLinear(int M, int K, int N, double fwd_tol, double bwd_tol) {
  auto inp = RoundTrip<T>(RandomVector(size_t(M) * K, 1));
  auto w = RoundTrip<T>(RandomVector(size_t(N) * K, 2, 0.5));
  auto b = RandomVector(N, 3);
  auto r = RoundTrip<T>(RandomVector(size_t(M) * N, 4));  // dout

  std::vector<T> out(size_t(M) * N), dinp(size_t(M) * K);
  std::vector<float> bias(b.begin(), b.end()), dw(size_t(N) * K, 0.5f), db(N, 0.25f);
  auto inp_t = ToTyped<T>(inp), w_t = ToTyped<T>(w), r_t = ToTyped<T>(r);
  MatmulForward(out.data(), inp_t.data(), w_t.data(), bias.data(), M, K, N);
  EXPECT_LT(MaxRelError(ToDouble(out), RefLinear(inp, w, b, M, K, N)), fwd_tol);

  MatmulBackward(dinp.data(), dw.data(), db.data(), r_t.data(), inp_t.data(), w_t.data(), M, K, N);
  auto loss = [&](const std::vector<double>& i, const std::vector<double>& ww,
                  const std::vector<double>& bb) { return Dot(RefLinear(i, ww, bb, M, K, N), r); };
  auto g_inp = NumericalGradient([&](const std::vector<double>& v) { return loss(v, w, b); }, inp);
  auto g_w = NumericalGradient([&](const std::vector<double>& v) { return loss(inp, v, b); }, w);
  auto g_b = NumericalGradient([&](const std::vector<double>& v) { return loss(inp, w, v); }, b);
  // Parameter gradients accumulate: subtract what was there before.
  std::vector<double> dw_d(dw.begin(), dw.end()), db_d(db.begin(), db.end());
  for (auto& x : dw_d) x -= 0.5;
  for (auto& x : db_d) x -= 0.25;
  EXPECT_LT(MaxRelError(ToDouble(dinp), g_inp), bwd_tol);
  EXPECT_LT(MaxRelError(dw_d, g_w), bwd_tol);
  EXPECT_LT(MaxRelError(db_d, g_b), bwd_tol);
}

// fp32: the finite difference in float64 is exact to ~1e-9; what remains is fp32 accumulation.
TEST(Matmul, Fp32MatchesFiniteDifferences) { CheckLinear<float>(5, 7, 9, 1e-5, 1e-4); }
TEST(Matmul, Fp32OddSizes) { CheckLinear<float>(1, 17, 33, 1e-5, 1e-4); }
// bf16: inputs are rounded to bf16 before the reference sees them, so the only extra error is the
// bf16 rounding of the outputs and of dinp (2^-8 relative).
TEST(Matmul, Bf16MatchesFiniteDifferences) { CheckLinear<bf16>(6, 19, 13, 1e-2, 1e-2); }
// fp16: the same with fp16's finer rounding (2^-11); oneDNN's fp16 product on AVX512-FP16 CPUs,
// the widened fp32 one elsewhere.
TEST(Matmul, Fp16MatchesFiniteDifferences) { CheckLinear<f16>(6, 19, 13, 2e-3, 2e-3); }

// The bias gradient adds each column's rows in row order, in fp32, into what was there: the same
// bits as that scalar loop, whatever the thread count (N not a multiple of a vector, more threads
// than blocks of columns). A split of the rows across threads would change the bits.
TEST(Matmul, BiasGradientSumsRowsInOrderWhateverTheThreads) {
  for (int N : {5, 77, 1000}) {
    SCOPED_TRACE(N);
    const int M = 37;
    const std::vector<double> r = RandomVector(size_t(M) * N, 5);
    const std::vector<float> dout(r.begin(), r.end());
    std::vector<float> want(N, 0.25f);
    for (int n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int m = 0; m < M; ++m) acc += dout[size_t(m) * N + n];
      want[n] += acc;
    }
    for (int threads : {1, 2, 3, 8}) {
      test::ScopedNumThreads scoped(threads);
      std::vector<float> db(N, 0.25f);
      MatmulBackward<float>(nullptr, nullptr, db.data(), dout.data(), nullptr, nullptr, M, 1, N);
      EXPECT_TRUE(test::BitwiseEqual(db, want)) << threads << " threads";
    }
  }
}

// The probe per type: fp32 is never widened; bf16 is native where the CPU has bf16 dot products
// faster than its FMAs (kernels/cpu_isa.h) and widened where they are slower or where it has no
// AVX-512 (oneDNN 2.6 has no bf16 matmul there).
TEST(Matmul, ProbeFindsTheCpusProducts) {
  EXPECT_FALSE(ProductsEmulated(DType::kF32));
  if (__builtin_cpu_supports("avx512bf16")) {
    EXPECT_EQ(ProductsEmulated(DType::kBF16), Bf16ProductsInFp32());
  }
  if (!__builtin_cpu_supports("avx512f")) {
    EXPECT_TRUE(ProductsEmulated(DType::kBF16));
  }
  std::printf("this CPU: bf16 products %s, fp16 products %s\n",
              ProductsEmulated(DType::kBF16) ? "widened to fp32" : "native",
              ProductsEmulated(DType::kF16) ? "widened to fp32" : "native");
}

TEST(Matmul, AccumulateAddsIntoOutput) {
  const int M = 3, K = 4, N = 5;
  auto inp = ToTyped<float>(RandomVector(M * K, 5));
  auto w = ToTyped<float>(RandomVector(N * K, 6));
  std::vector<float> a(M * N), b(M * N, 2.0f);
  MatmulForward(a.data(), inp.data(), w.data(), nullptr, M, K, N);
  MatmulForward(b.data(), inp.data(), w.data(), nullptr, M, K, N, /*accumulate=*/true);
  for (int i = 0; i < M * N; ++i) EXPECT_NEAR(b[i], a[i] + 2.0f, 1e-5);
}

// Output rows 4 KiB apart (GPT-2's 4·768-float hidden rows) and untransposed products run on
// oneDNN's gemm kernel, where its brgemm is slow (kernels/cpu/matmul.cc); both against float64,
// with a bias and adding into what C holds.
TEST(Matmul, Fp32FourKibRowsAndUntransposedProducts) {
  const int M = 8, K = 16, N = 1024;  // N floats: 4 KiB rows
  auto inp = RandomVector(size_t(M) * K, 7), w = RandomVector(size_t(N) * K, 8, 0.5);
  auto b = RandomVector(N, 9);
  auto inp_t = ToTyped<float>(inp), w_t = ToTyped<float>(w);
  std::vector<float> bias(b.begin(), b.end()), out(size_t(M) * N, 1.0f);
  MatmulForward(out.data(), inp_t.data(), w_t.data(), bias.data(), M, K, N, /*accumulate=*/true);
  auto ref = RefLinear(inp, w, b, M, K, N);
  for (double& x : ref) x += 1.0;
  EXPECT_LT(MaxRelError(ToDouble(out), ref), 1e-5);

  GemmArgs fwd;  // MatmulForward's product above
  fwd.trans_b = true;
  fwd.M = M, fwd.N = N, fwd.K = K, fwd.lda = K, fwd.ldb = K, fwd.ldc = N;
  fwd.beta = 1.0f, fwd.bias = bias.data();
  EXPECT_EQ(GemmKernel(fwd).rfind("gemm:", 0), 0u) << GemmKernel(fwd);

  // dinp (M,N) = dout (M,K) · w read as (K,N): rows of N floats again, and no transposes.
  std::vector<float> dinp(size_t(M) * N);
  auto dout = RandomVector(size_t(M) * K, 10);
  auto dout_t = ToTyped<float>(dout);
  MatmulBackward<float>(dinp.data(), nullptr, nullptr, dout_t.data(), nullptr, w_t.data(), M, N, K);
  std::vector<double> dref(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) dref[size_t(m) * N + n] += dout[m * K + k] * w[size_t(k) * N + n];
  EXPECT_LT(MaxRelError(ToDouble(dinp), dref), 1e-5);
  GemmArgs nn;
  nn.M = nn.N = nn.K = nn.lda = nn.ldb = nn.ldc = 96;
  EXPECT_EQ(GemmKernel(nn).rfind("gemm:", 0), 0u) << GemmKernel(nn);
}

// Loss of every row, float64, with the padded columns masked.
std::vector<double> RefLosses(const std::vector<double>& x, const std::vector<double>& wte,
                              const std::vector<int32_t>& tgt, int M, int C, int V) {
  std::vector<double> losses(M);
  for (int m = 0; m < M; ++m) {
    std::vector<double> l(V);
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += x[m * C + c] * wte[size_t(v) * C + c];
      l[v] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    losses[m] = tgt[m] < 0 ? 0 : mx + std::log(sum) - l[tgt[m]];
  }
  return losses;
}

template <typename T>
void CheckClassifier(int M, int C, int V, double fwd_tol, double bwd_tol) {
  const int Vp = (V + 127) / 128 * 128;
  auto x = RoundTrip<T>(RandomVector(size_t(M) * C, 7));
  auto wte = RoundTrip<T>(RandomVector(size_t(Vp) * C, 8, 0.3));
  // Padded rows hold garbage on purpose: the mask must keep them out.
  for (size_t i = size_t(V) * C; i < wte.size(); ++i) wte[i] = 5.0;
  std::vector<int32_t> tgt(M);
  for (int m = 0; m < M; ++m) tgt[m] = (m * 7919) % V;
  if (M > 2) tgt[1] = -1;  // no loss at this row
  const double dloss = 1.0 / M;

  auto x_t = ToTyped<T>(x), w_t = ToTyped<T>(wte);
  std::vector<float> losses(M), dwte(size_t(Vp) * C, 0.0f);
  std::vector<T> dx(size_t(M) * C);
  ClassifierForwardBackward(losses.data(), dx.data(), dwte.data(), x_t.data(), w_t.data(),
                            tgt.data(), float(dloss), M, C, V, Vp);
  auto ref = RefLosses(x, wte, tgt, M, C, V);
  EXPECT_LT(MaxRelError(std::vector<double>(losses.begin(), losses.end()), ref), fwd_tol);

  std::vector<float> fwd_only(M);
  ClassifierForward(fwd_only.data(), x_t.data(), w_t.data(), tgt.data(), M, C, V, Vp);
  EXPECT_EQ(fwd_only, losses);

  auto total = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    double s = 0;
    for (double l : RefLosses(xx, ww, tgt, M, C, V)) s += l * dloss;
    return s;
  };
  auto g_x = NumericalGradient([&](const std::vector<double>& v) { return total(v, wte); }, x);
  EXPECT_LT(MaxRelError(ToDouble(dx), g_x), bwd_tol);
  // Only the real vocabulary's rows are checked by differences; padded rows must get nothing.
  std::vector<double> w_real(wte.begin(), wte.begin() + size_t(V) * C);
  auto g_w = NumericalGradient(
      [&](const std::vector<double>& v) {
        auto full = wte;
        std::copy(v.begin(), v.end(), full.begin());
        return total(x, full);
      },
      w_real);
  std::vector<double> dw_real(dwte.begin(), dwte.begin() + size_t(V) * C);
  EXPECT_LT(MaxRelError(dw_real, g_w), bwd_tol);
  for (size_t i = size_t(V) * C; i < dwte.size(); ++i) ASSERT_EQ(dwte[i], 0.0f) << i;
}

TEST(Classifier, Fp32MatchesFiniteDifferences) { CheckClassifier<float>(5, 12, 37, 1e-5, 1e-3); }
TEST(Classifier, Fp32MoreRowsThanATile) { CheckClassifier<float>(131, 3, 5, 1e-5, 1e-3); }
TEST(Classifier, Bf16MatchesFiniteDifferences) { CheckClassifier<bf16>(4, 9, 21, 1e-4, 2e-2); }

// bf16 over several row tiles (512 rows each) and a vocabulary wider than the fp32 path's 8192-row
// chunks, against gradients computed in float64 from the same bf16 inputs: the path where the
// classifier widens its operands once (CPUs whose bf16 products run in fp32) and the native one.
TEST(Classifier, Bf16SeveralTilesAndAWideVocabulary) {
  const int M = 1100, C = 8, V = 9000, Vp = 9088;
  auto x = RoundTrip<bf16>(RandomVector(size_t(M) * C, 11));
  auto wte = RoundTrip<bf16>(RandomVector(size_t(Vp) * C, 12, 0.5));
  std::vector<int32_t> tgt(M);
  for (int m = 0; m < M; ++m) tgt[m] = (m * 7919) % V;
  const double dloss = 1.0 / M;
  auto x_t = ToTyped<bf16>(x), w_t = ToTyped<bf16>(wte);
  std::vector<float> losses(M), dwte(size_t(Vp) * C, 0.0f);
  std::vector<bf16> dx(size_t(M) * C);
  ClassifierForwardBackward(losses.data(), dx.data(), dwte.data(), x_t.data(), w_t.data(),
                            tgt.data(), float(dloss), M, C, V, Vp);
  std::vector<double> ref_dx(size_t(M) * C, 0.0), ref_dw(size_t(Vp) * C, 0.0);
  auto ref = RefLosses(x, wte, tgt, M, C, V);
  std::vector<double> p(V);
  for (int m = 0; m < M; ++m) {
    double mx = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) {
      p[v] = 0;
      for (int c = 0; c < C; ++c) p[v] += x[size_t(m) * C + c] * wte[size_t(v) * C + c];
      mx = std::max(mx, p[v]);
    }
    for (int v = 0; v < V; ++v) sum += p[v] = std::exp(p[v] - mx);
    for (int v = 0; v < V; ++v) {
      const double g = (p[v] / sum - (v == tgt[m])) * dloss;
      for (int c = 0; c < C; ++c) {
        ref_dx[size_t(m) * C + c] += g * wte[size_t(v) * C + c];
        ref_dw[size_t(v) * C + c] += g * x[size_t(m) * C + c];
      }
    }
  }
  EXPECT_LT(MaxRelError(std::vector<double>(losses.begin(), losses.end()), ref), 1e-4);
  EXPECT_LT(MaxRelError(ToDouble(dx), ref_dx), 2e-2);
  EXPECT_LT(MaxRelError(std::vector<double>(dwte.begin(), dwte.end()), ref_dw), 2e-2);
  for (size_t i = size_t(V) * C; i < dwte.size(); ++i) ASSERT_EQ(dwte[i], 0.0f) << i;
}

// How many of one row's weight gradients dwte[v][c] = g[v]·x[c] (x powers of two, so exact) show
// a g[v] that T cannot hold: the products must read the gradient rounded to T, also where they
// run in fp32 on widened operands (a native product reads it as stored).
template <typename T>
int UnroundedGradients() {
  const int C = 4, V = 300, Vp = 304;
  const std::vector<double> x = {1, 2, 0.5, -1};
  auto wte = RoundTrip<T>(RandomVector(size_t(Vp) * C, 21, 0.5));
  auto x_t = ToTyped<T>(x), w_t = ToTyped<T>(wte);
  const int32_t target = 17;
  float loss;
  std::vector<T> dx(C);
  std::vector<float> dwte(size_t(Vp) * C, 0.0f);
  ClassifierForwardBackward(&loss, dx.data(), dwte.data(), x_t.data(), w_t.data(), &target, 1.0f, 1,
                            C, V, Vp);
  int unrounded = 0;
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c) {
      const float g = dwte[size_t(v) * C + c] / float(x[c]);
      unrounded += ToFloat(FromFloat<T>(g)) != g || (g == 0.0f && v != target);
    }
  return unrounded;
}

// In a fresh process per setting (the products' path is chosen once per process).
TEST(Classifier, ProductsReadGradientsRoundedToTheirType) {
  testing::GTEST_FLAG(death_test_style) = "threadsafe";
  for (const char* products : {"native", "fp32"})
    EXPECT_EXIT(
        {
          setenv("KEEL_BF16_PRODUCTS", products, 1);
          const int n = UnroundedGradients<bf16>();
          std::fprintf(stderr, "%d unrounded\n", n);
          std::exit(n == 0 ? 0 : 1);
        },
        testing::ExitedWithCode(0), "^0 unrounded")
        << "KEEL_BF16_PRODUCTS=" << products;
  EXPECT_EQ(UnroundedGradients<f16>(), 0);
}

// A NaN in one vocabulary row (a corrupted weight) enters every row's softmax normalizer: every
// loss must be NaN, not only a row whose target it is. A max or exp that drops NaN would leave
// the losses finite and the corruption unseen.
TEST(Classifier, NanInOneVocabularyRowReachesEveryLoss) {
  const int M = 3, C = 4, V = 300, Vp = 304;
  auto x = ToTyped<float>(RandomVector(size_t(M) * C, 22));
  auto wte = ToTyped<float>(RandomVector(size_t(Vp) * C, 23, 0.5));
  for (int bad : {7, 150, 299}) {  // the max's and exp's first, middle and tail vectors
    std::vector<float> w = wte;
    w[size_t(bad) * C + 2] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<int32_t> targets = {17, 18, 19};
    std::vector<float> losses(M), dx(size_t(M) * C), dwte(size_t(Vp) * C, 0.0f);
    ClassifierForwardBackward(losses.data(), dx.data(), dwte.data(), x.data(), w.data(),
                              targets.data(), 1.0f, M, C, V, Vp);
    for (int m = 0; m < M; ++m) EXPECT_TRUE(std::isnan(losses[m])) << "row " << m << " bad " << bad;
  }
}

// V = 50257 (GPT-2): only the loss is compared (finite differences over 50257·C entries would be
// slow), and the gradient's rows must sum to zero over the vocabulary (softmax minus one-hot).
TEST(Classifier, Gpt2VocabularyLoss) {
  const int M = 3, C = 16, V = 50257, Vp = 50304;
  auto x = RandomVector(size_t(M) * C, 9);
  auto wte = RandomVector(size_t(Vp) * C, 10, 0.2);
  std::vector<int32_t> tgt = {0, 50256, 12345};
  auto x_t = ToTyped<float>(x), w_t = ToTyped<float>(wte);
  std::vector<float> losses(M), dx(size_t(M) * C), dwte(size_t(Vp) * C, 0.0f);
  ClassifierForwardBackward(losses.data(), dx.data(), dwte.data(), x_t.data(), w_t.data(),
                            tgt.data(), 1.0f, M, C, V, Vp);
  auto ref = RefLosses(x, wte, tgt, M, C, V);
  for (int m = 0; m < M; ++m) EXPECT_NEAR(losses[m], ref[m], 1e-4 * std::abs(ref[m]));
  // Σ_v dwte[v, c] = Σ_m (Σ_v g[m,v]) x[m,c] = 0.
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int v = 0; v < Vp; ++v) s += dwte[size_t(v) * C + c];
    EXPECT_NEAR(s, 0.0, 1e-3);
  }
}

TEST(VecMath, ExpApproxMatchesStdExp) {
  for (float x = -80; x < 80; x += 0.0137f) {
    float want = std::exp(x);
    EXPECT_NEAR(ExpApprox(x), want, 4e-7 * double(want)) << x;  // in float, flushed
  }
  EXPECT_EQ(ExpApprox(-100.0f), 0.0f);
}

}  // namespace
}  // namespace keel::kernels::cpu
