// One training step's fp32 matrix products, through keel (kernels/cpu/matmul.cc picks oneDNN's
// gemm kernel for untransposed products and 4 KiB output rows, brgemm elsewhere) beside oneDNN's
// matmul as it comes (its first implementation, brgemm on AVX-512; output rows 4 KiB apart padded
// into a scratch and copied out, since brgemm runs at a third of its speed on them), in one
// invocation. Each product runs on its own operands, laid out as the model's, in the step's order,
// so that what comes from cache is what a step would find there. Prints each kind of product's ms
// per step and GFLOP/s, then the totals and keel / oneDNN.
//
//   build/gemm_kernels [MODEL] [B] [T] [STEPS]   # default gpt2 4 256 3 (one warm-up step first)
//   build/gemm_kernels gpt2-mini 16 128          # the quickstart's shapes
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "keel/core/memory.h"
#include "keel/core/timer.h"
#include "keel/kernels/backend.h"
#include "keel/kernels/cpu/matmul.h"
#include "keel/model/config.h"
#include "keel/monitor/flops.h"

using namespace keel;

namespace {

// C (M,N) = op(A) op(B) (+ C), row-major, as keel's products ask for them.
struct Product {
  std::string kind;
  bool ta, tb;
  int M, N, K;
  const float *A, *B;
  float* C;
  int lda, ldb, ldc;
  bool accumulate;
};

// oneDNN's matmul as it comes: the first implementation it offers.
class Plain {
 public:
  void Run(const Product& p) {
    const bool aliasing = size_t(p.ldc) * 4 % 4096 == 0;
    Product q = p;
    if (aliasing) {  // rows 64 bytes longer, as keel did before it chose kernels
      q.ldc = p.ldc + 16;
      pad_.resize(size_t(p.M) * q.ldc);
      q.C = pad_.data();
      if (p.accumulate) Copy(q.C, q.ldc, p.C, p.ldc, p.M, p.N);
    }
    Prim(q).execute(stream_, {{DNNL_ARG_SRC, Mem(q.ta, q.M, q.K, q.lda, q.A)},
                              {DNNL_ARG_WEIGHTS, Mem(q.tb, q.K, q.N, q.ldb, q.B)},
                              {DNNL_ARG_DST, Mem(false, q.M, q.N, q.ldc, q.C)}});
    stream_.wait();
    if (aliasing) Copy(p.C, p.ldc, q.C, q.ldc, p.M, p.N);
  }

 private:
  static dnnl::memory::desc Desc(bool trans, int rows, int cols, int ld) {
    using dims = dnnl::memory::dims;
    return {{rows, cols}, dnnl::memory::data_type::f32, trans ? dims{1, ld} : dims{ld, 1}};
  }
  dnnl::memory Mem(bool trans, int rows, int cols, int ld, const float* x) {
    return dnnl::memory(Desc(trans, rows, cols, ld), engine_, const_cast<float*>(x));
  }
  dnnl::matmul& Prim(const Product& p) {
    char key[128];
    std::snprintf(key, sizeof key, "%d%d %d %d %d %d %d %d %d", p.ta, p.tb, p.M, p.N, p.K, p.lda,
                  p.ldb, p.ldc, p.accumulate);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    dnnl::primitive_attr attr;
    if (p.accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    const dnnl::matmul::desc op(Desc(p.ta, p.M, p.K, p.lda), Desc(p.tb, p.K, p.N, p.ldb),
                                Desc(false, p.M, p.N, p.ldc));
    return cache_.emplace(key, dnnl::matmul({op, attr, engine_})).first->second;
  }
  static void Copy(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r)
      std::memcpy(dst + size_t(r) * dst_ld, src + size_t(r) * src_ld, sizeof(float) * cols);
  }
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<std::string, dnnl::matmul> cache_;
  std::vector<float> pad_;
};

// keel's products as its kernels call them. Gemm's copy for the build's baseline instruction set
// (kernels/cpu/isa.h): every copy hands its products to the same oneDNN kernels.
kernels::cpu::GemmArgs Args(const Product& p) {
  kernels::cpu::GemmArgs g;
  g.trans_a = p.ta, g.trans_b = p.tb;
  g.M = p.M, g.N = p.N, g.K = p.K;
  g.A = p.A, g.lda = p.lda;
  g.B = p.B, g.ldb = p.ldb;
  g.C = p.C, g.ldc = p.ldc;
  g.beta = p.accumulate ? 1.0f : 0.0f;
  return g;
}

void RunKeel(const Product& p) { kernels::cpu::Gemm(Args(p)); }

float* Fill(std::vector<Buffer>& keep, size_t n, float scale) {
  keep.emplace_back(kernels::Cpu(), n * sizeof(float));
  float* x = keep.back().as<float>();
  for (size_t i = 0; i < n; ++i) x[i] = scale * float(int(i % 13) - 6);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "gpt2";
  const int B = argc > 2 ? std::atoi(argv[2]) : 4, T = argc > 3 ? std::atoi(argv[3]) : 256;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 3;
  const model::ModelConfig cfg = model::NamedConfig(name);
  const int M = B * T, C = cfg.n_embd, L = cfg.n_layer, V = cfg.padded_vocab();
  const int R = std::min(M, 512);  // the classifier's row tile (kernels/cpu/classifier.cc)

  // Every layer's weights, gradients and activations apart, as in a step.
  std::vector<Buffer> keep;
  const int in[4] = {C, C, C, 4 * C}, out[4] = {3 * C, C, 4 * C, C};
  const char* names[4] = {"qkv", "attn proj", "fc", "fc proj"};
  std::vector<Product> step;
  std::vector<Product> backward;
  for (int l = 0; l < L; ++l)
    for (int j = 0; j < 4; ++j) {
      const int K = in[j], N = out[j];
      float *w = Fill(keep, size_t(N) * K, 1e-3f), *dw = Fill(keep, size_t(N) * K, 0);
      float *x = Fill(keep, size_t(M) * K, 1e-2f), *y = Fill(keep, size_t(M) * N, 0);
      float *dx = Fill(keep, size_t(M) * K, 0), *dy = Fill(keep, size_t(M) * N, 1e-2f);
      const std::string n = names[j];
      step.push_back({n + " forward", false, true, M, N, K, x, w, y, K, K, N, false});
      backward.push_back({n + " input grad", false, false, M, K, N, dy, w, dx, N, K, K, false});
      backward.push_back({n + " weight grad", true, false, N, K, M, dy, x, dw, N, K, K, true});
    }
  float *wte = Fill(keep, size_t(V) * C, 1e-3f), *dwte = Fill(keep, size_t(V) * C, 0);
  float *h = Fill(keep, size_t(M) * C, 1e-2f), *dh = Fill(keep, size_t(M) * C, 0);
  float* logits = Fill(keep, size_t(R) * V, 1e-3f);
  // The classifier's chunks of the vocabulary for its fp32 logits and input gradient.
  constexpr int kLogitChunk = 16384, kChunk = 8192;
  for (int r0 = 0; r0 < M; r0 += R) {
    for (int v0 = 0; v0 < V; v0 += kLogitChunk)
      step.push_back({"classifier logits", false, true, R, std::min(kLogitChunk, V - v0), C,
                      h + size_t(r0) * C, wte + size_t(v0) * C, logits + v0, C, C, V, false});
    for (int v0 = 0; v0 < V; v0 += kChunk)
      step.push_back({"classifier input grad", false, false, R, C, std::min(kChunk, V - v0),
                      logits + v0, wte + size_t(v0) * C, dh + size_t(r0) * C, V, C, C, v0 > 0});
    step.push_back({"classifier weight grad", true, false, V, C, R, logits, h + size_t(r0) * C,
                    dwte, V, C, C, true});
  }
  step.insert(step.end(), backward.rbegin(), backward.rend());

  Plain plain;
  std::map<std::string, double> flops, ms[2];
  std::map<std::string, std::string> kernel;  // keel's, for the kind's first product
  double total_flops = 0;
  for (const Product& p : step) {
    flops[p.kind] += 2.0 * p.M * p.N * p.K;
    total_flops += 2.0 * p.M * p.N * p.K;
    if (!kernel.count(p.kind)) kernel[p.kind] = kernels::cpu::GemmKernel(Args(p));
  }
  for (int s = 0; s <= steps; ++s)
    for (int impl = 0; impl < 2; ++impl)  // alternating, so that both see the same machine
      for (const Product& p : step) {
        Timer t;
        impl == 0 ? RunKeel(p) : plain.Run(p);
        if (s > 0) ms[impl][p.kind] += t.Millis() / steps;
      }
  const double peak = monitor::MachinePeak(DType::kF32, omp_get_max_threads()).flops;
  std::printf("%s B=%d T=%d fp32 products, %d threads, peak %.0f GFLOP/s\n", name.c_str(), B, T,
              omp_get_max_threads(), peak / 1e9);
  std::printf("%-24s %10s %8s %12s %8s %8s  %s\n", "product", "keel ms", "GFLOP/s", "oneDNN ms",
              "GFLOP/s", "ratio", "keel's kernel");
  double tk = 0, tp = 0;
  for (const auto& [kind, f] : flops) {
    const double k = ms[0][kind], p = ms[1][kind];
    tk += k, tp += p;
    std::printf("%-24s %10.1f %8.0f %12.1f %8.0f %7.2fx  %s\n", kind.c_str(), k, f / k / 1e6, p,
                f / p / 1e6, p / k, kernel[kind].c_str());
  }
  std::printf("%-24s %10.1f %8.0f %12.1f %8.0f %7.2fx\n", "all (a step)", tk,
              total_flops / tk / 1e6, tp, total_flops / tp / 1e6, tp / tk);
  std::printf("of the peak: keel %.1f%%, oneDNN as it comes %.1f%%\n",
              100 * total_flops / (tk / 1e3) / peak, 100 * total_flops / (tp / 1e3) / peak);
}
