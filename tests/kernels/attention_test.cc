// Attention: forward and lse against a float64 full-softmax reference, backward against float64
// central differences of L = Σ out·R, and determinism across calls and thread counts.
//
// Shapes cover T = 1, T = 5, a head size that is not a multiple of 16 (C = 18, NH = 3 → hs = 6),
// T past one 64-row tile (T = 130), B = 2, and GPT-2's hs = 64; grouped-query shapes (NKV < NH)
// cover groups of 2, 3 and 4 query heads and one key/value head for all (multi-query). Shapes
// marked `docs` pack documents of 1 to 70 positions into each row (document masking), so that
// query tiles start inside, at and across document starts.
#include "keel/kernels/cpu/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::MaxRelError;
using test::RandomVector;
using test::RoundTrip;
using test::ToDouble;
using test::ToTyped;

struct Shape {
  int B, T, C, NH, NKV = 0;  // NKV 0: NH (no grouping)
  bool docs = false;         // document masking (DocStarts)
  int kv() const { return NKV > 0 ? NKV : NH; }
  int Row() const { return C + 2 * kv() * (C / NH); }  // q, k, v columns per position
};

// Each position's document start (B·T) for a `docs` shape, else empty: documents of lengths
// cycling through a list, from a different place in it for each batch row.
std::vector<int32_t> DocStarts(const Shape& s) {
  if (!s.docs) return {};
  const int lens[] = {37, 3, 70, 1, 25, 66, 5};
  std::vector<int32_t> ds(size_t(s.B) * s.T);
  for (int b = 0; b < s.B; ++b) {
    int start = 0, k = b, left = lens[b % 7];
    for (int i = 0; i < s.T; ++i, --left) {
      if (left == 0) start = i, left = lens[++k % 7];
      ds[size_t(b) * s.T + i] = start;
    }
  }
  return ds;
}

// Float64 causal attention with a full softmax per row: out (B,T,C), lse (B,NH,T). Query head h
// reads key/value head h / (NH/NKV); under document masking query i reads keys from its
// document's start.
void ReferenceForward(std::vector<double>& out, std::vector<double>& lse,
                      const std::vector<double>& qkv, const Shape& s) {
  const std::vector<int32_t> ds = DocStarts(s);
  const int hs = s.C / s.NH, row = s.Row(), group = s.NH / s.kv();
  const double scale = 1.0 / std::sqrt(double(hs));
  out.assign(size_t(s.B) * s.T * s.C, 0.0);
  lse.assign(size_t(s.B) * s.NH * s.T, 0.0);
  std::vector<double> score(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const double* q = &qkv[(size_t(b) * s.T + i) * row + size_t(h) * hs];
        const size_t kv = size_t(h / group) * hs;
        double mx = -std::numeric_limits<double>::infinity();
        const int j0 = ds.empty() ? 0 : ds[size_t(b) * s.T + i];
        for (int j = j0; j <= i; ++j) {
          const double* k = &qkv[(size_t(b) * s.T + j) * row + s.C + kv];
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          score[j] = dot * scale;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int j = j0; j <= i; ++j) sum += std::exp(score[j] - mx);
        double* o = &out[(size_t(b) * s.T + i) * s.C + size_t(h) * hs];
        for (int j = j0; j <= i; ++j) {
          const double* v = &qkv[(size_t(b) * s.T + j) * row + s.C + size_t(s.kv()) * hs + kv];
          double p = std::exp(score[j] - mx) / sum;
          for (int d = 0; d < hs; ++d) o[d] += p * v[d];
        }
        lse[(size_t(b) * s.NH + h) * s.T + i] = mx + std::log(sum);
      }
}

template <typename T>
struct KernelResult {
  std::vector<T> out;
  std::vector<float> lse;
  std::vector<T> dqkv;
};

// Forward, then backward with dout = R, on inputs rounded to T.
template <typename T>
KernelResult<T> RunKernel(const std::vector<double>& qkv, const std::vector<double>& R,
                          const Shape& s) {
  KernelResult<T> r;
  std::vector<T> qkv_t = ToTyped<T>(qkv), dout = ToTyped<T>(R);
  r.out.resize(size_t(s.B) * s.T * s.C);
  r.lse.resize(size_t(s.B) * s.NH * s.T);
  // Poison dqkv: the backward must overwrite every element.
  r.dqkv.assign(qkv.size(), FromFloat<T>(std::numeric_limits<float>::quiet_NaN()));
  const std::vector<int32_t> ds = DocStarts(s);
  const int32_t* doc = ds.empty() ? nullptr : ds.data();
  AttentionForward(r.out.data(), r.lse.data(), qkv_t.data(), s.B, s.T, s.C, s.NH, s.NKV, doc);
  AttentionBackward(r.dqkv.data(), dout.data(), qkv_t.data(), r.out.data(), r.lse.data(), s.B, s.T,
                    s.C, s.NH, s.NKV, doc);
  return r;
}

template <typename T>
void CheckForward(const Shape& s, double out_tol, double lse_tol) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH
                                    << " NKV=" << s.kv() << " docs=" << s.docs);
  std::vector<double> qkv = RoundTrip<T>(RandomVector(size_t(s.B) * s.T * s.Row(), 1));
  std::vector<double> R = RandomVector(size_t(s.B) * s.T * s.C, 2);
  std::vector<double> out_ref, lse_ref;
  ReferenceForward(out_ref, lse_ref, qkv, s);
  KernelResult<T> r = RunKernel<T>(qkv, R, s);
  EXPECT_LE(MaxRelError(ToDouble(r.out), out_ref), out_tol);
  std::vector<double> lse(r.lse.begin(), r.lse.end());
  EXPECT_LE(MaxRelError(lse, lse_ref), lse_tol);
}

// The last shape has B·NH = 16 heads, enough for the forward to give whole heads to threads; the
// others split heads into query tiles.
const Shape kShapes[] = {{1, 1, 8, 2},
                         {2, 5, 18, 3},
                         {2, 130, 18, 3},
                         {1, 64, 32, 1},
                         {2, 100, 128, 2},
                         {1, 200, 48, 3},
                         {2, 150, 256, 8},
                         {2, 70, 24, 4, 2},
                         {1, 130, 36, 6, 2},
                         {2, 90, 64, 4, 1},
                         {2, 150, 256, 8, 2},
                         {2, 130, 18, 3, 0, true},
                         {1, 200, 48, 3, 0, true},
                         {2, 150, 256, 8, 2, true},
                         {2, 70, 24, 4, 2, true}};

// fp32: the kernel differs from float64 only by fp32 rounding of sums of ≤ T terms: 1e-5 leaves
// two orders of margin over the ~1e-7 seen.
TEST(AttentionForward, Fp32MatchesFloat64Reference) {
  for (const Shape& s : kShapes) CheckForward<float>(s, 1e-5, 1e-5);
}

// bf16: inputs are exact bf16 values, so the error is the output's own rounding (2^-9 relative)
// plus fp32 noise; lse is stored in fp32.
TEST(AttentionForward, Bf16MatchesFloat64Reference) {
  for (const Shape& s : kShapes) CheckForward<bf16>(s, 1e-2, 1e-5);
}

// Backward vs central differences of L = Σ out·R in float64, at every input element for small
// shapes and at 300 random elements (q, k and v alike) for the larger ones.
template <typename T>
void CheckBackward(const Shape& s, double tol) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH
                                    << " NKV=" << s.kv() << " docs=" << s.docs);
  // bf16: the kernel sees rounded qkv and R, so the float64 function is taken at those values.
  std::vector<double> qkv = RoundTrip<T>(RandomVector(size_t(s.B) * s.T * s.Row(), 3));
  std::vector<double> R = RoundTrip<T>(RandomVector(size_t(s.B) * s.T * s.C, 4));
  KernelResult<T> r = RunKernel<T>(qkv, R, s);
  auto loss = [&](const std::vector<double>& x) {
    std::vector<double> out, lse;
    ReferenceForward(out, lse, x, s);
    double L = 0;
    for (size_t i = 0; i < out.size(); ++i) L += out[i] * R[i];
    return L;
  };
  std::vector<double> got = ToDouble(r.dqkv);
  std::vector<size_t> idx;
  if (qkv.size() <= 2000) {
    for (size_t i = 0; i < qkv.size(); ++i) idx.push_back(i);
  } else {
    std::mt19937_64 gen(5);
    for (int k = 0; k < 300; ++k) idx.push_back(gen() % qkv.size());
  }
  std::vector<double> want = test::NumericalGradientAt(loss, qkv, idx, 1e-5);
  std::vector<double> got_at(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) got_at[k] = got[idx[k]];
  EXPECT_LE(MaxRelError(got_at, want), tol);
  for (double g : got) ASSERT_TRUE(std::isfinite(g)) << "dqkv not fully overwritten";
}

const Shape kGradShapes[] = {{1, 1, 8, 2},
                             {2, 5, 18, 3},
                             {2, 130, 18, 3},
                             {1, 70, 128, 2},
                             {2, 5, 24, 4, 2},
                             {1, 70, 36, 6, 2},
                             {2, 9, 16, 4, 1},
                             {2, 130, 18, 3, 0, true},
                             {1, 70, 36, 6, 2, true},
                             {2, 9, 16, 4, 1, true}};

// fp32 accumulation of ≤ T terms against exact gradients: 1e-3 relative to the largest entry.
TEST(AttentionBackward, Fp32MatchesFiniteDifferences) {
  for (const Shape& s : kGradShapes) CheckBackward<float>(s, 1e-3);
}

// bf16: out is rounded to bf16 before D = Σ dout·out and dqkv is rounded on store (2^-9 each).
TEST(AttentionBackward, Bf16MatchesFiniteDifferences) {
  for (const Shape& s : kGradShapes) CheckBackward<bf16>(s, 3e-2);
}

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(Attention, RepeatsBitwise) {
  const Shape s{2, 200, 128, 2};
  std::vector<double> qkv = RandomVector(size_t(s.B) * s.T * s.Row(), 6);
  std::vector<double> R = RandomVector(size_t(s.B) * s.T * s.C, 7);
  KernelResult<float> a = RunKernel<float>(qkv, R, s), b = RunKernel<float>(qkv, R, s);
  EXPECT_TRUE(BitwiseEqual(a.out, b.out));
  EXPECT_TRUE(BitwiseEqual(a.lse, b.lse));
  EXPECT_TRUE(BitwiseEqual(a.dqkv, b.dqkv));
  KernelResult<bf16> c = RunKernel<bf16>(qkv, R, s), d = RunKernel<bf16>(qkv, R, s);
  EXPECT_TRUE(BitwiseEqual(c.out, d.out));
  EXPECT_TRUE(BitwiseEqual(c.dqkv, d.dqkv));
}

// Each output element's reduction order is fixed whatever the split, so one and two threads
// agree; the bound is 1e-6 relative (in practice they are bitwise equal). B·NH = 6 heads: one
// thread takes the forward head by head, two split it by query tiles.
TEST(Attention, IndependentOfThreadCount) {
  for (const Shape s :
       {Shape{2, 200, 96, 3}, Shape{2, 200, 96, 6, 2}, Shape{2, 200, 96, 6, 2, true}}) {
    std::vector<double> qkv = RandomVector(size_t(s.B) * s.T * s.Row(), 8);
    std::vector<double> R = RandomVector(size_t(s.B) * s.T * s.C, 9);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    KernelResult<float> one = RunKernel<float>(qkv, R, s);
    omp_set_num_threads(2);
    KernelResult<float> two = RunKernel<float>(qkv, R, s);
    omp_set_num_threads(threads);
    EXPECT_LE(MaxRelError(ToDouble(one.out), ToDouble(two.out)), 1e-6);
    EXPECT_LE(MaxRelError(ToDouble(one.lse), ToDouble(two.lse)), 1e-6);
    EXPECT_LE(MaxRelError(ToDouble(one.dqkv), ToDouble(two.dqkv)), 1e-6);
  }
}

// A NaN in one query or key (a corrupted activation) reaches exactly the outputs whose softmax
// reads it: a vectorized exp that turned NaN into a number would leave those rows finite, and the
// corruption would pass the loss unseen.
TEST(Attention, NanReachesTheRowsThatReadIt) {
  const Shape s{1, 130, 32, 2};  // hs 16; T past two query tiles
  const int hs = s.C / s.NH, nan_q = 70, nan_k = 100;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> qkv = ToTyped<float>(RandomVector(size_t(s.T) * s.Row(), 10));
  qkv[size_t(nan_q) * s.Row() + 3] = nan;             // head 0's query at 70
  qkv[size_t(nan_k) * s.Row() + s.C + hs + 5] = nan;  // head 1's key at 100
  std::vector<float> out(size_t(s.T) * s.C), lse(size_t(s.NH) * s.T);
  AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  for (int i = 0; i < s.T; ++i)
    for (int h = 0; h < s.NH; ++h) {
      const bool reads_nan = h == 0 ? i == nan_q : i >= nan_k;
      const float* o = &out[size_t(i) * s.C + size_t(h) * hs];
      for (int d = 0; d < hs; ++d)
        ASSERT_EQ(std::isnan(o[d]), reads_nan) << "row " << i << " head " << h << " d " << d;
      ASSERT_EQ(std::isnan(lse[size_t(h) * s.T + i]), reads_nan) << "row " << i << " head " << h;
    }
}

// The backward, a NaN in one output gradient (head 0, row 70): that row's query gradient and the
// key and value gradients of every key it saw turn NaN. A key just past it (71, in the same
// 4-row block of the diagonal tile, whose dS is 0·(0 − D) with D NaN) does too: harmless, the
// step is lost anyway. So only keys from the next tile on are held finite, with every other
// row's query gradient and head 1 whole.
TEST(Attention, NanInAnOutputGradientReachesWhatItsRowSaw) {
  const Shape s{1, 200, 32, 2};
  const int hs = s.C / s.NH, bad = 70;
  std::vector<float> qkv = ToTyped<float>(RandomVector(size_t(s.T) * s.Row(), 11));
  std::vector<float> dout = ToTyped<float>(RandomVector(size_t(s.T) * s.C, 12));
  dout[size_t(bad) * s.C + 3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(size_t(s.T) * s.C), lse(size_t(s.NH) * s.T), dqkv(qkv.size());
  AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C,
                    s.NH);
  auto any_nan = [&](int row, int col0) {
    bool nan = false;
    for (int d = 0; d < hs; ++d) nan |= std::isnan(dqkv[size_t(row) * s.Row() + col0 + d]);
    return nan;
  };
  for (int i = 0; i < s.T; ++i) {
    EXPECT_EQ(any_nan(i, 0), i == bad) << "dq head 0 row " << i;
    EXPECT_FALSE(any_nan(i, hs)) << "dq head 1 row " << i;
    for (int part : {1, 2}) {  // k, v
      const int head0 = s.C * part, head1 = head0 + hs;
      if (i <= bad) EXPECT_TRUE(any_nan(i, head0)) << "part " << part << " head 0 row " << i;
      if (i >= 128) EXPECT_FALSE(any_nan(i, head0)) << "part " << part << " head 0 row " << i;
      EXPECT_FALSE(any_nan(i, head1)) << "part " << part << " head 1 row " << i;
    }
  }
}

}  // namespace
}  // namespace keel::kernels::cpu
