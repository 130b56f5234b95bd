// Context parallelism's attention alone (model/context_parallel.h) against keel's single-rank
// kernel over the whole sequence, at cp = the ranks launched (ctest: mpirun -np 2 and -np 4):
// 2 sequences of 2·cp·L tokens with L odd (37: chunks end inside the kernel's 64-row tiles and
// causal masks cross chunk boundaries), 4 query heads over 4, 2 and 1 key/value heads. fp32: the
// output and log-sum-exp of every row equal the whole-sequence kernel's bitwise (the same tiles
// in the same order), the q, k, v gradients within 2e-6 of the largest: the key and value
// gradients are partial sums per rank added over the group, another order than the one kernel's,
// and at cp 4 (296 rows) that rounding alone reaches 1.0e-6 of the largest. bf16 within 1e-2.
// Both ways of moving keys and values (ring: forward within 1e-6, blocks merged), and with packed
// documents (document masking) that begin in other ranks' chunks.
//
// Not named *_test.cc: that would glob it into the single-process train_test binary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "keel/kernels/backend.h"
#include "keel/model/context_parallel.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/zigzag.h"

namespace {

using namespace keel;

constexpr int kB = 2, kL = 37, kNH = 4, kHs = 16;

template <typename E>
std::vector<E> Random(size_t n, uint64_t seed) {
  std::vector<E> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (E& e : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = FromFloat<E>(float(double(x >> 11) / double(1ull << 53) * 2.0 - 1.0));
  }
  return v;
}

// Rows (b, t) of this rank out of (b, position) rows of `width` elements.
template <typename E>
std::vector<E> Mine(const std::vector<E>& whole, int width, int T, int cp, int rank) {
  const int Tl = T / cp;
  std::vector<E> out(size_t(kB) * Tl * width);
  for (int b = 0; b < kB; ++b)
    for (int t = 0; t < Tl; ++t) {
      const size_t from = (size_t(b) * T + parallel::ZigzagPosition(cp, rank, Tl, t)) * width;
      std::copy_n(whole.begin() + from, width, out.begin() + (size_t(b) * Tl + t) * width);
    }
  return out;
}

// The largest |got - want| over the largest |want|.
template <typename E>
double Relative(const std::vector<E>& got, const std::vector<E>& want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(ToFloat(got[i]))) return INFINITY;  // std::max would pass a NaN by
    diff = std::max(diff, std::fabs(double(ToFloat(got[i])) - ToFloat(want[i])));
    scale = std::max(scale, std::fabs(double(ToFloat(want[i]))));
  }
  return diff / scale;
}

// `docs`: packed documents of 29 tokens (the first 11 of the second sequence a document of its
// own), so that a row's document often begins in another rank's chunk.
template <typename E>
int Check(parallel::Comm& cp, model::CpComm comm, int NKV, double grad_limit, bool docs = false) {
  const kernels::Backend& be = kernels::Cpu();
  const int n = cp.size(), rank = cp.rank(), T = 2 * n * kL, Tl = T / n;
  const int C = kNH * kHs, KV2 = 2 * NKV * kHs, S = C + KV2;
  std::vector<E> qkv = Random<E>(size_t(kB) * T * S, 1), dout = Random<E>(size_t(kB) * T * C, 2);
  // With documents, the first token's query points away from its key (score about -130): its
  // log-sum-exp is far below -88, where exp(-lse) overflows (the kernel's exp saturates at
  // e^88) for a row seeing no key of a block, and its output gradient is large enough that the
  // product with that overflows too.
  if (docs)
    for (int h = 0; h < kNH; ++h)
      for (int d = 0; d < kHs; ++d) {
        qkv[size_t(h) * kHs + d] =
            FromFloat<E>(-100.0f * ToFloat(qkv[size_t(C) + size_t(h / (kNH / NKV)) * kHs + d]));
        dout[size_t(h) * kHs + d] = FromFloat<E>(50.0f * ToFloat(dout[size_t(h) * kHs + d]));
      }
  std::vector<int32_t> starts(size_t(kB) * T);
  for (int b = 0; b < kB; ++b)
    for (int p = 0; p < T; ++p) {
      const int q = b == 1 ? p - 11 : p;
      starts[size_t(b) * T + p] = q < 0 ? 0 : q / 29 * 29 + (b == 1 ? 11 : 0);
    }
  const int32_t* whole_docs = docs ? starts.data() : nullptr;
  std::vector<E> out(size_t(kB) * T * C), dqkv(qkv.size());
  std::vector<float> lse(size_t(kB) * kNH * T);
  be.AttentionForward(out.data(), lse.data(), qkv.data(), kB, T, C, kNH, NKV, whole_docs);
  be.AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), kB, T, C, kNH,
                       NKV, whole_docs);

  // The buffers the activation plan would hold, by their sizes there.
  std::vector<std::vector<char>> held;
  auto get = [&](const char* name) -> char* {
    for (const model::CpBufferSize& b :
         model::CpBufferSizes(comm, n, size_t(kB) * Tl, size_t(S), size_t(C), kNH, sizeof(E)))
      if (std::string(b.name) == name) return held.emplace_back(b.elems * b.elem_bytes).data();
    return nullptr;
  };
  const model::CpBuffers<E> buf = model::CpBuffersAt<E>(get, size_t(kB) * Tl * KV2);
  const std::vector<int32_t> my_docs = Mine(starts, 1, T, n, rank);
  const model::CpShape shape{kB, Tl, C, kNH, NKV, docs ? my_docs.data() : nullptr};
  const std::vector<E> my_qkv = Mine(qkv, S, T, n, rank), my_dout = Mine(dout, C, T, n, rank);
  std::vector<E> my_out(size_t(kB) * Tl * C), my_dqkv(my_qkv.size());
  std::vector<float> my_lse(size_t(kB) * kNH * Tl);
  model::CpStats stats;
  model::CpAttentionForward(be, cp, comm, 60, shape, buf, my_out.data(), my_lse.data(),
                            my_qkv.data(), &stats);
  model::CpAttentionBackward(be, cp, comm, 60, shape, buf, my_dqkv.data(), my_dout.data(),
                             my_qkv.data(), my_out.data(), my_lse.data(), &stats);

  // The statistics are (b, head, t): their rows per head, as (b·NH, position) rows of one.
  std::vector<float> lse_rows(size_t(kB) * kNH * Tl);
  for (int bh = 0; bh < kB * kNH; ++bh)
    for (int t = 0; t < Tl; ++t)
      lse_rows[size_t(bh) * Tl + t] =
          lse[size_t(bh) * T + parallel::ZigzagPosition(n, rank, Tl, t)];
  const double e_out = Relative(my_out, Mine(out, C, T, n, rank));
  const double e_lse = Relative(my_lse, lse_rows);
  const double e_grad = Relative(my_dqkv, Mine(dqkv, S, T, n, rank));
  // The all-gather's forward is the whole kernel's, tile for tile; the ring merges blocks.
  const bool exact = DTypeOf<E>() == DType::kF32 && comm == model::CpComm::kAllGather;
  const double fwd_limit = DTypeOf<E>() == DType::kF32 ? 1e-6 : grad_limit;
  const bool ok = (exact ? e_out == 0 && e_lse == 0 : e_out <= fwd_limit && e_lse <= fwd_limit) &&
                  e_grad <= grad_limit;
  std::printf(
      "cp %d %s rank %d %s NKV %d%s: out %.1e, lse %.1e (limit %s), dqkv %.1e (limit %g), %.0f "
      "bytes sent %s\n",
      n, parallel::CpCommName(comm), rank, DTypeName(DTypeOf<E>()), NKV, docs ? " documents" : "",
      e_out, e_lse,
      exact               ? "0"
      : fwd_limit == 1e-6 ? "1e-6"
                          : "1e-2",
      e_grad, grad_limit, stats.bytes, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  auto world = keel::parallel::MakeMpiComm();
  int bad = 0;
  for (auto comm : {keel::model::CpComm::kRing, keel::model::CpComm::kAllGather}) {
    for (int nkv : {4, 2, 1}) bad += Check<float>(*world, comm, nkv, 2e-6);
    bad += Check<float>(*world, comm, 2, 2e-6, /*docs=*/true);
    bad += Check<keel::bf16>(*world, comm, 2, 1e-2);
  }
  const bool failed = world->AllReduceMax(double(bad)) > 0;
  if (world->rank() == 0) std::printf(failed ? "FAILED\n" : "context-parallel attention matches\n");
  return failed ? 1 : 0;
}
