// The backend seam. Every kernel operation, forward and backward, through the CUDA backend against
// the CPU backend (itself checked against float64 references and finite differences by the other
// kernel tests), on random inputs of odd sizes, in fp32 (≤ 1e-5 of the largest reference value)
// and bf16 (≤ 2e-2: both sides round their outputs to bf16, 2^-8 apart at most, and accumulate in
// fp32 in different orders). The CUDA cases skip, saying why, where no GPU is visible (CI);
// scripts/gpu_check.sh runs them on one. The memory cases run everywhere.
#include "keel/kernels/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "keel/core/error.h"

namespace keel::kernels {
namespace {

using Outputs = std::vector<std::vector<float>>;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Buffers of one backend, filled from host vectors (rounded to bf16 where the dtype says so)
// and read back as floats.
class Dev {
 public:
  Dev(const Backend& be, DType t) : be_(be), t_(t) {}
  const Backend& be() const { return be_; }
  void* Up(const std::vector<float>& x) {
    return t_ == DType::kF32 ? static_cast<void*>(UpF(x)) : static_cast<void*>(UpBf16(x));
  }
  float* UpF(const std::vector<float>& x) {
    return static_cast<float*>(Put(x.data(), 4 * x.size()));
  }
  bf16* UpBf16(const std::vector<float>& x) {
    std::vector<bf16> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = ToBf16(x[i]);
    return static_cast<bf16*>(Put(h.data(), 2 * h.size()));
  }
  int32_t* UpI(const std::vector<int32_t>& x) {
    return static_cast<int32_t*>(Put(x.data(), 4 * x.size()));
  }
  std::vector<float> Down(const void* p, size_t n) const {
    return t_ == DType::kF32 ? DownF(static_cast<const float*>(p), n) : DownBf16(p, n);
  }
  std::vector<float> DownF(const float* p, size_t n) const {
    std::vector<float> h(n);
    be_.ToHost(h.data(), p, 4 * n);
    return h;
  }
  std::vector<float> DownBf16(const void* p, size_t n) const {
    std::vector<bf16> h(n);
    be_.ToHost(h.data(), p, 2 * n);
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = ToFloat(h[i]);
    return f;
  }

 private:
  void* Put(const void* host, size_t bytes) {
    bufs_.push_back(std::make_unique<Buffer>(be_, bytes));
    be_.FromHost(bufs_.back()->data(), host, bytes);
    return bufs_.back()->data();
  }
  const Backend& be_;
  DType t_;
  std::vector<std::unique_ptr<Buffer>> bufs_;
};

using Op = std::function<Outputs(Dev&)>;

// The GPU backend, or why there is none.
const Backend* Gpu(std::string* why) {
  if (!CudaBuilt()) {
    *why = "this keel was built without the CUDA backend";
    return nullptr;
  }
  try {
    return &Get(Device::kCuda);
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
}

class CudaAgainstCpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string why;
    gpu_ = Gpu(&why);
    if (!gpu_ && std::getenv("KEEL_REQUIRE_GPU")) FAIL() << "KEEL_REQUIRE_GPU is set: " << why;
    if (!gpu_) GTEST_SKIP() << "no GPU backend here: " << why;
  }
  // Runs `op` on both backends and compares every output.
  void Compare(const char* what, const Op& op) {
    const DType t = GetParam();
    const double tol = t == DType::kF32 ? 1e-5 : 2e-2;
    Dev cpu(Cpu(), t), gpu(*gpu_, t);
    const Outputs want = op(cpu), got = op(gpu);
    ASSERT_EQ(want.size(), got.size());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(want[k].size(), got[k].size());
      double scale = 1e-30, err = 0;
      size_t worst = 0;
      for (size_t i = 0; i < want[k].size(); ++i) {
        scale = std::max(scale, double(std::fabs(want[k][i])));
        const double e = std::fabs(double(want[k][i]) - got[k][i]);
        if (!(e <= err)) err = e, worst = i;
      }
      EXPECT_LE(err / scale, tol) << what << " (" << DTypeName(t) << "), output " << k
                                  << ": element " << worst << " is " << got[k][worst]
                                  << ", the CPU backend's " << want[k][worst];
    }
  }
  const Backend* gpu_ = nullptr;
};

TEST_P(CudaAgainstCpu, Matmul) {
  for (bool acc : {false, true}) {
    const int M = 37, K = 67, N = 29;
    Compare("matmul", [&](Dev& d) -> Outputs {
      void* out = d.Up(Random(size_t(M) * N, 1));
      const void* inp = d.Up(Random(size_t(M) * K, 2));
      const void* w = d.Up(Random(size_t(N) * K, 3, 0.1f));
      const float* bias = d.UpF(Random(size_t(N), 4));
      void* dinp = d.Up(Random(size_t(M) * K, 5));
      float* dw = d.UpF(Random(size_t(N) * K, 6));
      float* db = d.UpF(Random(size_t(N), 7));
      const void* dout = d.Up(Random(size_t(M) * N, 8));
      const Backend& be = d.be();
      if (GetParam() == DType::kF32) {
        be.MatmulForward(static_cast<float*>(out), static_cast<const float*>(inp),
                         static_cast<const float*>(w), bias, M, K, N, acc);
        be.MatmulBackward(static_cast<float*>(dinp), dw, db, static_cast<const float*>(dout),
                          static_cast<const float*>(inp), static_cast<const float*>(w), M, K, N);
      } else {
        be.MatmulForward(static_cast<bf16*>(out), static_cast<const bf16*>(inp),
                         static_cast<const bf16*>(w), bias, M, K, N, acc);
        be.MatmulBackward(static_cast<bf16*>(dinp), dw, db, static_cast<const bf16*>(dout),
                          static_cast<const bf16*>(inp), static_cast<const bf16*>(w), M, K, N);
      }
      return {d.Down(out, size_t(M) * N), d.Down(dinp, size_t(M) * K), d.DownF(dw, size_t(N) * K),
              d.DownF(db, size_t(N))};
    });
  }
}

// Runs a typed body with the pointers cast to the parameter's element type.
template <typename F>
void WithType(DType t, F&& f) {
  if (t == DType::kF32)
    f(float{});
  else
    f(bf16{});
}

// Head sizes 16, 64, 16 (grouped), 8, 128 (multi-query), 32; bf16 runs twice: the tensor-core
// kernels (head sizes 16, 32, 64, 128) and the simple ones.
TEST_P(CudaAgainstCpu, Attention) {
  struct S {
    int B, T, C, NH, NKV;
  };
  const std::vector<S> shapes = {S{2, 67, 48, 3, 3}, S{1, 130, 128, 2, 2}, S{2, 33, 64, 4, 2},
                                 S{1, 5, 32, 4, 1},  S{1, 200, 256, 2, 1}, S{2, 70, 96, 3, 3}};
  const int passes = GetParam() == DType::kBF16 ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == 1) setenv("KEEL_CUDA_ATTENTION", "simple", 1);
    for (const S& s : shapes) {
      const int hs = s.C / s.NH, W = s.C + 2 * s.NKV * hs;
      const size_t rows = size_t(s.B) * s.T;
      Compare(pass ? "attention (simple kernels)" : "attention", [&](Dev& d) -> Outputs {
        const void* qkv = d.Up(Random(rows * W, 11));
        void* out = d.Up(std::vector<float>(rows * s.C));
        float* lse = d.UpF(std::vector<float>(size_t(s.B) * s.NH * s.T));
        const void* dout = d.Up(Random(rows * s.C, 12));
        void* dqkv = d.Up(std::vector<float>(rows * W));
        WithType(GetParam(), [&](auto z) {
          using T = decltype(z);
          d.be().AttentionForward(static_cast<T*>(out), lse, static_cast<const T*>(qkv), s.B, s.T,
                                  s.C, s.NH, s.NKV);
          d.be().AttentionBackward(static_cast<T*>(dqkv), static_cast<const T*>(dout),
                                   static_cast<const T*>(qkv), static_cast<const T*>(out), lse, s.B,
                                   s.T, s.C, s.NH, s.NKV);
        });
        return {d.Down(out, rows * s.C), d.DownF(lse, size_t(s.B) * s.NH * s.T),
                d.Down(dqkv, rows * W)};
      });
    }
  }
  unsetenv("KEEL_CUDA_ATTENTION");
}

TEST_P(CudaAgainstCpu, Norms) {
  const int N = 37, C = 67;
  for (bool rms : {false, true}) {
    Compare(rms ? "rmsnorm" : "layernorm", [&](Dev& d) -> Outputs {
      const void* inp = d.Up(Random(size_t(N) * C, 21));
      const void* w = d.Up(Random(size_t(C), 22));
      const void* b = d.Up(Random(size_t(C), 23));
      void* out = d.Up(std::vector<float>(size_t(N) * C));
      float* mean = d.UpF(std::vector<float>(size_t(N)));
      float* rstd = d.UpF(std::vector<float>(size_t(N)));
      const void* dout = d.Up(Random(size_t(N) * C, 24));
      void* dinp = d.Up(Random(size_t(N) * C, 25));
      float* dw = d.UpF(Random(size_t(C), 26));
      float* db = d.UpF(Random(size_t(C), 27));
      WithType(GetParam(), [&](auto z) {
        using T = decltype(z);
        const Backend& be = d.be();
        const T *x = static_cast<const T*>(inp), *wt = static_cast<const T*>(w);
        if (rms) {
          be.RmsNormForward(static_cast<T*>(out), rstd, x, wt, N, C, 1e-5f);
          be.RmsNormBackward(static_cast<T*>(dinp), dw, static_cast<const T*>(dout), x, wt, rstd, N,
                             C);
        } else {
          be.LayerNormForward(static_cast<T*>(out), mean, rstd, x, wt, static_cast<const T*>(b), N,
                              C);
          be.LayerNormBackward(static_cast<T*>(dinp), dw, db, static_cast<const T*>(dout), x, wt,
                               mean, rstd, N, C);
        }
      });
      return {d.Down(out, size_t(N) * C), d.DownF(rstd, size_t(N)), d.Down(dinp, size_t(N) * C),
              d.DownF(dw, size_t(C)), d.DownF(db, size_t(C))};
    });
  }
}

TEST_P(CudaAgainstCpu, Activations) {
  const int N = 37, F = 53;
  const size_t n = 1001;
  Compare("gelu, swiglu", [&](Dev& d) -> Outputs {
    const void* x = d.Up(Random(n, 31, 2.0f));
    const void* dy = d.Up(Random(n, 32));
    void* y = d.Up(std::vector<float>(n));
    void* dx = d.Up(std::vector<float>(n));
    const void* gu = d.Up(Random(size_t(N) * 2 * F, 33, 2.0f));
    const void* dh = d.Up(Random(size_t(N) * F, 34));
    void* h = d.Up(std::vector<float>(size_t(N) * F));
    void* dgu = d.Up(std::vector<float>(size_t(N) * 2 * F));
    WithType(GetParam(), [&](auto z) {
      using T = decltype(z);
      const Backend& be = d.be();
      be.GeluForward(static_cast<T*>(y), static_cast<const T*>(x), n);
      be.GeluBackward(static_cast<T*>(dx), static_cast<const T*>(x), static_cast<const T*>(dy), n);
      be.SwigluForward(static_cast<T*>(h), static_cast<const T*>(gu), N, F);
      be.SwigluBackward(static_cast<T*>(dgu), static_cast<const T*>(gu), static_cast<const T*>(dh),
                        N, F);
    });
    return {d.Down(y, n), d.Down(dx, n), d.Down(h, size_t(N) * F), d.Down(dgu, size_t(N) * 2 * F)};
  });
}

// fp8: the emulation's rounding in both formats and the largest magnitude; and in bf16 the fp8
// products, native where the GPU has fp8 tensor cores (NativeFp8), against the CPU's emulation
// (rounded operands, then the bf16 product).
TEST_P(CudaAgainstCpu, Fp8) {
  const int M = 64, K = 96, N = 48;
  const size_t n = 1001;
  Compare("fp8 rounding, amax", [&](Dev& d) -> Outputs {
    const void* x = d.Up(Random(n, 41, 300.0f));
    void* e4 = d.Up(std::vector<float>(n));
    void* e5 = d.Up(std::vector<float>(n));
    float amax = 0;
    WithType(GetParam(), [&](auto z) {
      using T = decltype(z);
      const Backend& be = d.be();
      be.Fp8Round(static_cast<T*>(e4), static_cast<const T*>(x), n, 0.5f, Fp8Format::kE4M3);
      be.Fp8Round(static_cast<T*>(e5), static_cast<const T*>(x), n, 64.0f, Fp8Format::kE5M2);
      amax = be.AbsMax(static_cast<const T*>(x), n);
    });
    return {d.Down(e4, n), d.Down(e5, n), {amax}};
  });
  if (GetParam() != DType::kBF16) return;
  Compare("fp8 products", [&](Dev& d) -> Outputs {
    const Backend& be = d.be();
    auto* x = static_cast<bf16*>(d.Up(Random(size_t(M) * K, 42, 3.0f)));
    auto* w = static_cast<bf16*>(d.Up(Random(size_t(N) * K, 43, 0.1f)));
    auto* dy = static_cast<bf16*>(d.Up(Random(size_t(M) * N, 44, 1e-3f)));
    auto* y = static_cast<bf16*>(d.Up(std::vector<float>(size_t(M) * N)));
    auto* dx = static_cast<bf16*>(d.Up(std::vector<float>(size_t(M) * K)));
    std::vector<float> zeros(size_t(N) * K);
    Buffer dw(be, zeros.size() * sizeof(float));
    be.FromHost(dw.data(), zeros.data(), dw.bytes());
    const float sx = Fp8Scale(3.0f, Fp8Format::kE4M3), sw = Fp8Scale(0.1f, Fp8Format::kE4M3),
                sdy = Fp8Scale(1e-3f, Fp8Format::kE5M2);
    if (be.NativeFp8(M, K, N)) {
      be.MatmulFp8Forward(y, x, w, nullptr, M, K, N, sx, sw, false);
      be.MatmulFp8Backward(dx, dw.as<float>(), dy, x, w, M, K, N, sdy, sx, sw);
    } else {
      auto* xq = static_cast<bf16*>(d.Up(std::vector<float>(size_t(M) * K)));
      auto* wq = static_cast<bf16*>(d.Up(std::vector<float>(size_t(N) * K)));
      auto* dyq = static_cast<bf16*>(d.Up(std::vector<float>(size_t(M) * N)));
      be.Fp8Round(xq, x, size_t(M) * K, sx, Fp8Format::kE4M3);
      be.Fp8Round(wq, w, size_t(N) * K, sw, Fp8Format::kE4M3);
      be.Fp8Round(dyq, dy, size_t(M) * N, sdy, Fp8Format::kE5M2);
      be.MatmulForward(y, xq, wq, nullptr, M, K, N);
      be.MatmulBackward(dx, dw.as<float>(), nullptr, dyq, xq, wq, M, K, N);
    }
    std::vector<float> dw_host(zeros.size());
    be.ToHost(dw_host.data(), dw.data(), dw.bytes());
    return {d.Down(y, size_t(M) * N), d.Down(dx, size_t(M) * K), dw_host};
  });
}

TEST_P(CudaAgainstCpu, Dequantize) {
  const size_t n = 64 * 37;
  std::vector<int32_t> packed(n / 4);  // n bytes of codes, uploaded as ints
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = int32_t(uint32_t(i) * 2654435761u);
  const std::vector<float> scales = Random(n / 48 + 1, 51);  // enough for the smaller groups
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kNf4})
    Compare(f == QuantFormat::kInt8 ? "dequantize int8" : "dequantize nf4", [&](Dev& d) -> Outputs {
      const auto* codes = reinterpret_cast<const uint8_t*>(d.UpI(packed));
      const float* sc = d.UpF(scales);
      void* out = d.Up(std::vector<float>(n));
      WithType(GetParam(), [&](auto z) {
        using T = decltype(z);
        // Groups of 64 (nf4's) and of 48 (an int8 row's), the last one ragged.
        d.be().Dequantize(static_cast<T*>(out), codes, sc, n - 10,
                          f == QuantFormat::kInt8 ? 48 : 64, f);
      });
      return {d.Down(out, n)};
    });
}

TEST_P(CudaAgainstCpu, Dropout) {
  const int rows = 37, cols = 131;
  const size_t n = size_t(rows) * cols;
  Compare("dropout", [&](Dev& d) -> Outputs {
    const void* x = d.Up(Random(n, 61));
    void* out = d.Up(std::vector<float>(n));
    void* acc = d.Up(Random(n, 62));
    WithType(GetParam(), [&](auto z) {
      using T = decltype(z);
      // A block at rows from 1000 and columns from 64 (a tensor-parallel shard), p = 0.1.
      const DropoutMask m{77, 1000, 64, 429496730u, float(1.0 / 0.9)};
      d.be().Dropout(static_cast<T*>(out), static_cast<const T*>(x), rows, cols, m, false);
      d.be().Dropout(static_cast<T*>(acc), static_cast<const T*>(x), rows, cols, m, true);
    });
    return {d.Down(out, n), d.Down(acc, n)};
  });
}

TEST_P(CudaAgainstCpu, Dora) {
  const int rows = 23, out = 45, in = 131, r = 4;
  Compare("dora", [&](Dev& d) -> Outputs {
    const void* W = d.Up(Random(size_t(out) * in, 71));
    const void* A = d.Up(Random(size_t(r) * in, 72));
    const void* B = d.Up(Random(size_t(out) * r, 73));
    const float* mag = d.UpF(Random(size_t(out), 74));
    float* g = d.UpF(std::vector<float>(2 * size_t(out)));
    const void* z = d.Up(Random(size_t(rows) * out, 75));
    const void* dy = d.Up(Random(size_t(rows) * out, 76));
    void* y = d.Up(Random(size_t(rows) * out, 77));
    const float* bias = d.UpF(Random(size_t(out), 78));
    float* dmag = d.UpF(Random(size_t(out), 79));
    WithType(GetParam(), [&](auto zt) {
      using T = decltype(zt);
      d.be().DoraNorm(g, g + out, mag, static_cast<const T*>(W), static_cast<const T*>(A),
                      static_cast<const T*>(B), out, in, r, 1.5f);
      d.be().DoraScale(static_cast<T*>(y), static_cast<const T*>(z), g, bias, rows, out, true);
      d.be().DoraMagnitudeGrad(dmag, static_cast<const T*>(dy), static_cast<const T*>(z), g + out,
                               rows, out);
    });
    return {d.DownF(g, 2 * size_t(out)), d.Down(y, size_t(rows) * out), d.DownF(dmag, size_t(out))};
  });
}

TEST_P(CudaAgainstCpu, RopeAndEmbeddings) {
  const int B = 2, T = 13, NH = 4, NKV = 2, hs = 16, C = 24, V = 50;
  const size_t qkvn = size_t(B) * T * (NH + 2 * NKV) * hs;
  std::vector<int32_t> tokens(size_t(B) * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % V);
  Compare("rope, encoder", [&](Dev& d) -> Outputs {
    void* q = d.Up(Random(qkvn, 41));
    void* dq = d.Up(Random(qkvn, 42));
    const int32_t* tok = d.UpI(tokens);
    const void* wte = d.Up(Random(size_t(V) * C, 43));
    const void* wpe = d.Up(Random(size_t(T) * C, 44));
    void* out = d.Up(std::vector<float>(size_t(B) * T * C));
    const void* dout = d.Up(Random(size_t(B) * T * C, 45));
    float* dwte = d.UpF(Random(size_t(V) * C, 46));
    float* dwpe = d.UpF(Random(size_t(T) * C, 47));
    WithType(GetParam(), [&](auto z) {
      using U = decltype(z);
      const Backend& be = d.be();
      be.RopeForward(static_cast<U*>(q), B, T, NH, NKV, hs, 10000.0f, 3);
      be.RopeBackward(static_cast<U*>(dq), B, T, NH, NKV, hs, 10000.0f);
      be.EncoderForward(static_cast<U*>(out), tok, static_cast<const U*>(wte),
                        static_cast<const U*>(wpe), B, T, C);
      be.EncoderBackward(dwte, dwpe, static_cast<const U*>(dout), tok, B, T, C);
    });
    return {d.Down(q, qkvn), d.Down(dq, qkvn), d.Down(out, size_t(B) * T * C),
            d.DownF(dwte, size_t(V) * C), d.DownF(dwpe, size_t(T) * C)};
  });
}

TEST_P(CudaAgainstCpu, Classifier) {
  const int M = 37, C = 24, V = 301, Vp = 384;
  std::vector<int32_t> targets(static_cast<size_t>(M));
  for (int r = 0; r < M; ++r) targets[size_t(r)] = r % 9 == 4 ? -1 : (r * 37) % V;
  Compare("classifier", [&](Dev& d) -> Outputs {
    const void* x = d.Up(Random(size_t(M) * C, 51));
    const void* wte = d.Up(Random(size_t(Vp) * C, 52, 0.3f));
    const int32_t* tgt = d.UpI(targets);
    float* losses = d.UpF(std::vector<float>(size_t(M)));
    float* losses2 = d.UpF(std::vector<float>(size_t(M)));
    void* dx = d.Up(std::vector<float>(size_t(M) * C));
    float* dwte = d.UpF(Random(size_t(Vp) * C, 53));
    float* logits = d.UpF(std::vector<float>(size_t(M) * V));
    WithType(GetParam(), [&](auto z) {
      using T = decltype(z);
      const Backend& be = d.be();
      const T *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(wte);
      be.ClassifierForward(losses, xt, wt, tgt, M, C, V, Vp);
      be.ClassifierForwardBackward(losses2, static_cast<T*>(dx), dwte, xt, wt, tgt, 0.5f, M, C, V,
                                   Vp);
      be.ClassifierLogits(logits, xt, wt, M, C, V);
    });
    return {d.DownF(losses, size_t(M)), d.DownF(losses2, size_t(M)), d.Down(dx, size_t(M) * C),
            d.DownF(dwte, size_t(Vp) * C), d.DownF(logits, size_t(M) * V)};
  });
}

TEST_P(CudaAgainstCpu, OptimizerAndReductions) {
  const size_t n = 100003;
  Compare("adamw, sum of squares, bf16 rounding, add", [&](Dev& d) -> Outputs {
    float* master = d.UpF(Random(n, 61));
    float* m = d.UpF(Random(n, 62, 0.01f));
    std::vector<float> v0 = Random(n, 63, 0.01f);
    for (float& x : v0) x = x * x;
    float* v = d.UpF(v0);
    const float* g = d.UpF(Random(n, 64));
    bf16* working = d.UpBf16(std::vector<float>(n));
    float* acc = d.UpF(Random(n, 65));
    AdamWParams p;
    p.lr = 1e-3f, p.weight_decay = 0.1f, p.grad_scale = 0.7f, p.step = 3;
    const Backend& be = d.be();
    const double sq = be.SumSquares(g, n);
    be.AdamWUpdate(master, working, m, v, g, n, p);
    be.AddTo(acc, g, n);
    bf16* rounded = d.UpBf16(std::vector<float>(n));
    be.ToBf16(rounded, acc, n);
    return {d.DownF(master, n), d.DownF(m, n),          d.DownF(v, n), d.DownBf16(working, n),
            d.DownF(acc, n),    d.DownBf16(rounded, n), {float(sq)}};
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAgainstCpu, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Backend, CpuMemoryRoundTrips) {
  const Backend& be = Cpu();
  EXPECT_TRUE(be.host_visible());
  EXPECT_EQ(be.device(), Device::kCpu);
  Buffer z = Buffer::Zeroed(be, 4 * 1000);
  std::vector<float> host(1000, 1.0f);
  be.ToHost(host.data(), z.data(), z.bytes());
  for (float x : host) ASSERT_EQ(x, 0.0f);
  const std::vector<float> src = Random(1000, 71);
  be.FromHost(z.data(), src.data(), 4 * src.size());
  Buffer copy(be, z.bytes());
  be.Copy(copy.data(), z.data(), z.bytes());
  be.ToHost(host.data(), copy.data(), copy.bytes());
  EXPECT_EQ(host, src);
  Buffer moved = std::move(copy);
  EXPECT_EQ(copy.data(), nullptr);
  EXPECT_EQ(moved.bytes(), 4u * 1000);
}

// Zero and Copy split large buffers across the OpenMP threads: every byte of an odd-sized range
// (not a multiple of the threads' 64-byte pieces), at an odd offset, is zeroed or copied, and the
// bytes beside it are left as they were. Sizes on both sides of the split's threshold (1 MiB).
TEST(Backend, CpuZeroAndCopyCoverOddRanges) {
  const Backend& be = Cpu();
  for (size_t n : {size_t(5), size_t(1) << 20, (size_t(3) << 20) + 37}) {
    SCOPED_TRACE(n);
    std::vector<unsigned char> a(n + 2), b(n + 2);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(i * 7 + 1);
    b.assign(b.size(), 0xAB);
    be.Copy(b.data() + 1, a.data() + 1, n);
    ASSERT_EQ(b.front(), 0xAB);
    ASSERT_EQ(b.back(), 0xAB);
    ASSERT_TRUE(std::equal(a.begin() + 1, a.end() - 1, b.begin() + 1));
    be.Zero(a.data() + 1, n);
    ASSERT_EQ(a.front(), 1);
    ASSERT_EQ(a.back(), static_cast<unsigned char>((n + 1) * 7 + 1));
    ASSERT_TRUE(std::all_of(a.begin() + 1, a.end() - 1, [](unsigned char c) { return c == 0; }));
  }
}

// bf16 gradient buffers (optim.grad_dtype): a bucket is added into them with one rounding (the
// fp32 sum's round-to-nearest-even, not two), and widened into a bucket exactly.
TEST(Backend, Bf16GradientBuckets) {
  const Backend& be = Cpu();
  const std::vector<float> x = Random(1001, 72), a = Random(1001, 73);
  std::vector<bf16> acc(a.size());
  for (size_t i = 0; i < a.size(); ++i) acc[i] = ToBf16(a[i]);
  const std::vector<bf16> before = acc;
  be.AccumulateBf16(acc.data(), x.data(), x.size());
  std::vector<float> bucket = x;
  be.AddBf16To(bucket.data(), before.data(), bucket.size());
  int moved = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float sum = ToFloat(before[i]) + x[i];
    ASSERT_EQ(bucket[i], sum) << i;
    ASSERT_EQ(acc[i].bits, ToBf16(sum).bits) << i;
    moved += acc[i].bits != before[i].bits;
  }
  EXPECT_GT(moved, 900);
}

TEST(Backend, DeviceNames) {
  Device d = Device::kCuda;
  EXPECT_TRUE(ParseDevice("cpu", &d));
  EXPECT_EQ(d, Device::kCpu);
  EXPECT_TRUE(ParseDevice("cuda", &d));
  EXPECT_EQ(d, Device::kCuda);
  EXPECT_FALSE(ParseDevice("gpu", &d));
  EXPECT_STREQ(DeviceName(Device::kCuda), "cuda");
}

// Asking for a GPU that is not there is bad input naming the key and what is missing, not a
// crash. With the plugin built, it loads in this test binary (every keel symbol it needs is here)
// and it is the driver or the GPU that is missing.
TEST(Backend, CudaWithoutGpuIsBadInput) {
  std::string why;
  if (Gpu(&why)) GTEST_SKIP() << "a GPU is visible here";
  try {
    Get(Device::kCuda);
    FAIL() << "Get(kCuda) returned without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << msg;
    EXPECT_EQ(msg.rfind("[train] device = \"cuda\": ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    if (CudaBuilt())
      EXPECT_TRUE(msg.find("no GPU") != std::string::npos ||
                  msg.find("no usable NVIDIA driver") != std::string::npos)
          << msg;
    else
      EXPECT_NE(msg.find("no libkeel_cuda.so"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace keel::kernels
