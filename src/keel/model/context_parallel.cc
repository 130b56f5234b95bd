#include "keel/model/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/zigzag.h"

namespace keel::model {

std::vector<CpBufferSize> CpBufferSizes(CpComm comm, int cp, size_t rows, size_t qkv, size_t C,
                                        size_t NH, size_t elem) {
  const size_t KV2 = qkv - C;
  const bool ring = comm == CpComm::kRing;
  const size_t W = (ring ? 2 : size_t(cp)) * rows;
  std::vector<CpBufferSize> v = {
      {"cp_kv", elem, (ring ? 2 : 1 + size_t(cp)) * rows * KV2},
      {"cp_qkv", elem, W * qkv},
      {"cp_out", elem, W * C},
      {"cp_dout", elem, W * C},
      {"cp_dqkv", elem, W * qkv},
      {"cp_lse", 4, W * NH},
      {"cp_doc", 4, W},
  };
  if (ring) {
    v.push_back({"cp_dkv", 4, 2 * rows * KV2});
    v.push_back({"cp_end", 4, W});
    v.push_back({"cp_acc", 4, rows * C});
  }
  return v;
}

namespace {

// host: context parallelism runs where the backend computes in host memory (CpAttentionForward
// checks); its blocks are built by these copies.
template <typename E>
void Put(E* dst, const E* src, size_t n) {
  std::memcpy(dst, src, sizeof(E) * n);  // host: as above
}
template <typename E>
void Zero(E* dst, size_t n) {
  std::memset(dst, 0, sizeof(E) * n);  // host: as above
}

// Tags of the ring's two streams between neighbours (Comm::SendAsync: matched in issue order).
constexpr int kTagKv = 30001, kTagDkv = 30002;
constexpr float kNever = std::numeric_limits<float>::infinity();  // a statistic: probability 0

// Row sizes: the fused q, k, v columns (S), the query channels (C), the keys' and values' (KV2).
struct Geometry {
  int cp, rank, B, T, NH, NKV, C, KV2, S;
  const int32_t* doc_start;
  Geometry(const parallel::Comm& comm, const CpShape& s)
      : cp(comm.size()),
        rank(comm.rank()),
        B(s.B),
        T(s.T),
        NH(s.NH),
        NKV(s.NKV),
        C(s.C),
        KV2(2 * s.NKV * (s.C / s.NH)),
        S(s.C + 2 * s.NKV * (s.C / s.NH)),
        doc_start(s.doc_start) {}
  size_t Local(int b, int t) const { return size_t(b) * T + size_t(t); }
  // Where this rank's row's document begins (0: no document masking).
  int Doc(int b, int t) const { return doc_start ? doc_start[Local(b, t)] : 0; }
  int Pos(int q, int t) const { return parallel::ZigzagPosition(cp, q, T, t); }
  size_t kv_elems() const { return size_t(B) * T * KV2; }
};

template <typename E>
void PackKv(const Geometry& g, const E* qkv, E* kv) {
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t)
      Put(kv + g.Local(b, t) * g.KV2, qkv + g.Local(b, t) * g.S + g.C, g.KV2);
}

// Stand-in rows: no output gradient and no output, so that they add nothing (D = dO·O = 0); a
// statistic of 0 keeps their probabilities finite. This rank's rows `mine(b, t)` of the W-row
// block get its dout, out and lse.
template <typename E, typename Mine>
void BackwardRows(const Geometry& g, const CpBuffers<E>& buf, int W, const E* dout, const E* out,
                  const float* lse, Mine mine) {
  Zero(buf.dout, size_t(g.B) * W * g.C);
  Zero(buf.out, size_t(g.B) * W * g.C);
  Zero(buf.lse, size_t(g.B) * g.NH * W);
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      const size_t at = mine(b, t);
      Put(buf.dout + (size_t(b) * W + at) * g.C, dout + g.Local(b, t) * g.C, g.C);
      Put(buf.out + (size_t(b) * W + at) * g.C, out + g.Local(b, t) * g.C, g.C);
      for (int h = 0; h < g.NH; ++h)
        buf.lse[(size_t(b) * g.NH + h) * W + at] = lse[(size_t(b) * g.NH + h) * g.T + t];
    }
}

// ---- allgather: every row at its position in the whole sequence (W = cp·T rows) ----

// Every rank's keys and values into the whole sequence's q, k, v (this rank's queries at their
// positions, zeros elsewhere), and the document starts that hide the other ranks' rows.
template <typename E>
void GatherWhole(parallel::Comm& comm, double timeout_s, const Geometry& g, const CpBuffers<E>& buf,
                 const E* qkv, CpStats* stats) {
  const size_t n = g.kv_elems();
  const int W = g.cp * g.T;
  PackKv(g, qkv, buf.kv[0]);
  auto w =
      comm.AllGatherAsync(buf.kv[0], buf.kv[1], std::vector<size_t>(size_t(g.cp), n), DTypeOf<E>());
  stats->wait_ms +=
      parallel::WaitOrLost(*w, timeout_s, "a context-parallel all-gather of keys and values");
  stats->bytes += double(n) * (g.cp - 1) * sizeof(E);
  for (int q = 0; q < g.cp; ++q)
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        const int p = g.Pos(q, t);
        E* row = buf.qkv + (size_t(b) * W + p) * g.S;
        Put(row + g.C, buf.kv[1] + (size_t(q) * n + g.Local(b, t) * g.KV2), g.KV2);
        if (q == g.rank)
          Put(row, qkv + g.Local(b, t) * g.S, g.C);
        else
          Zero(row, g.C);
        buf.doc[size_t(b) * W + p] = q == g.rank ? g.Doc(b, t) : p;
      }
}

template <typename E>
void AllGatherForward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                      const Geometry& g, const CpBuffers<E>& buf, E* out, float* lse, const E* qkv,
                      CpStats* stats) {
  const int W = g.cp * g.T;
  GatherWhole(cp, timeout_s, g, buf, qkv, stats);
  be.AttentionForward(buf.out, buf.lse, buf.qkv, g.B, W, g.C, g.NH, g.NKV, buf.doc);
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      const int p = g.Pos(g.rank, t);
      Put(out + g.Local(b, t) * g.C, buf.out + (size_t(b) * W + p) * g.C, g.C);
      for (int h = 0; h < g.NH; ++h)
        lse[(size_t(b) * g.NH + h) * g.T + t] = buf.lse[(size_t(b) * g.NH + h) * W + p];
    }
}

template <typename E>
void AllGatherBackward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                       const Geometry& g, const CpBuffers<E>& buf, E* dqkv, const E* dout,
                       const E* qkv, const E* out, const float* lse, CpStats* stats) {
  const int W = g.cp * g.T;
  GatherWhole(cp, timeout_s, g, buf, qkv, stats);
  BackwardRows(g, buf, W, dout, out, lse, [&](int, int t) { return size_t(g.Pos(g.rank, t)); });
  be.AttentionBackward(buf.dqkv, buf.dout, buf.qkv, buf.out, buf.lse, g.B, W, g.C, g.NH, g.NKV,
                       buf.doc);
  // The queries' gradients are this rank's alone; the keys' and values' go to their owners.
  const size_t n = g.kv_elems();
  for (int q = 0; q < g.cp; ++q)
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        const E* row = buf.dqkv + (size_t(b) * W + g.Pos(q, t)) * g.S;
        Put(buf.kv[1] + (size_t(q) * n + g.Local(b, t) * g.KV2), row + g.C, g.KV2);
        if (q == g.rank) Put(dqkv + g.Local(b, t) * g.S, row, g.C);
      }
  auto w = cp.ReduceScatterSumAsync(buf.kv[1], buf.kv[0], std::vector<size_t>(size_t(g.cp), n),
                                    DTypeOf<E>());
  stats->wait_ms += parallel::WaitOrLost(
      *w, timeout_s, "a context-parallel reduce-scatter of key and value gradients");
  stats->bytes += double(n) * (g.cp - 1) * sizeof(E);
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t)
      Put(dqkv + g.Local(b, t) * g.S + g.C, buf.kv[0] + g.Local(b, t) * g.KV2, g.KV2);
}

// ---- ring: a block of W = 2·T rows, the visiting rank's keys [0, T), this rank's queries after
// ----

// Which of rank v's keys this rank's row at position p, whose document begins at position d,
// sees: rows [first, end) of v's, as v's first chunk precedes its second (the keys before any
// position are a prefix of v's rows). first >= end: none.
struct Seen {
  int first, end;
  bool any() const { return end > first; }
};
Seen Visible(const Geometry& g, int v, int p, int d) {
  const int L = g.T / 2;
  auto before = [&](int pos) {  // v's keys at positions < pos
    auto part = [&](int chunk) { return std::clamp(pos - chunk * L, 0, L); };
    return part(v) + part(2 * g.cp - 1 - v);
  };
  return {before(d), before(p + 1)};
}

// The block's constant rows: this rank's queries (keys and values zero) after the visiting rows
// (queries zero), which see themselves alone.
template <typename E>
void RingBlock(const Geometry& g, const CpBuffers<E>& buf, const E* qkv) {
  const int W = 2 * g.T;
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      E* visiting = buf.qkv + (size_t(b) * W + t) * g.S;
      E* mine = buf.qkv + (size_t(b) * W + g.T + t) * g.S;
      Zero(visiting, g.C);
      Put(mine, qkv + g.Local(b, t) * g.S, g.C);
      Zero(mine + g.C, g.KV2);
      buf.doc[size_t(b) * W + t] = t;
      buf.end[size_t(b) * W + t] = t + 1;
    }
}

// Rank v's keys and values into the block, and what each of this rank's rows sees of them; a
// row that sees none sees its own stand-in key (a result the merge skips).
template <typename E>
void RingVisit(const Geometry& g, const CpBuffers<E>& buf, const E* kv, int v) {
  const int W = 2 * g.T;
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      Put(buf.qkv + (size_t(b) * W + t) * g.S + g.C, kv + g.Local(b, t) * g.KV2, g.KV2);
      const Seen seen = Visible(g, v, g.Pos(g.rank, t), g.Doc(b, t));
      const size_t at = size_t(b) * W + g.T + t;
      buf.doc[at] = seen.any() ? seen.first : g.T + t;
      buf.end[at] = seen.any() ? seen.end : g.T + t + 1;
    }
}

// Whether this rank's row (b, t) sees any of the keys RingVisit put in the block: a row that sees
// none has its window on its own stand-in row, past the visiting ones.
template <typename E>
bool Sees(const Geometry& g, const CpBuffers<E>& buf, int b, int t) {
  return buf.doc[size_t(b) * 2 * g.T + g.T + t] < g.T;
}

// The ring's transfers of one step: what this rank holds goes on to the next rank, what the
// previous one holds comes in. Posted before the step's compute, waited for after it.
struct RingStep {
  std::unique_ptr<parallel::Work> send, recv;
  void Post(parallel::Comm& c, const void* out, void* in, size_t bytes, int tag, CpStats* stats) {
    const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
    recv = c.RecvAsync(in, bytes, prev, tag);
    send = c.SendAsync(out, bytes, next, tag);
    stats->bytes += double(bytes);
  }
  void Wait(double timeout_s, const char* what, CpStats* stats) {
    if (send) stats->wait_ms += parallel::WaitOrLost(*send, timeout_s, what);
    if (recv) stats->wait_ms += parallel::WaitOrLost(*recv, timeout_s, what);
    send.reset(), recv.reset();
  }
};

template <typename E>
void RingForward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                 const Geometry& g, const CpBuffers<E>& buf, E* out, float* lse, const E* qkv,
                 CpStats* stats) {
  const int W = 2 * g.T, hs = g.C / g.NH;
  const size_t kv_bytes = g.kv_elems() * sizeof(E);
  PackKv(g, qkv, buf.kv[0]);
  RingBlock(g, buf, qkv);
  std::fill(buf.acc, buf.acc + size_t(g.B) * g.T * g.C, 0.0f);
  std::fill(lse, lse + size_t(g.B) * g.NH * g.T, -std::numeric_limits<float>::infinity());
  for (int s = 0, cur = 0; s < g.cp; ++s, cur ^= 1) {
    const int v = (g.rank - s + g.cp) % g.cp;
    RingStep step;
    if (s + 1 < g.cp) step.Post(cp, buf.kv[cur], buf.kv[cur ^ 1], kv_bytes, kTagKv, stats);
    RingVisit(g, buf, buf.kv[cur], v);
    be.AttentionForward(buf.out, buf.lse, buf.qkv, g.B, W, g.C, g.NH, g.NKV, buf.doc, buf.end);
    // Merge the block into the rows' running output by the two log-sum-exps.
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        if (!Sees(g, buf, b, t)) continue;
        for (int h = 0; h < g.NH; ++h) {
          float& l = lse[(size_t(b) * g.NH + h) * g.T + t];
          const float lb = buf.lse[(size_t(b) * g.NH + h) * W + g.T + t];
          const float m = std::max(l, lb);
          const float merged = m + std::log(std::exp(l - m) + std::exp(lb - m));
          const float wa = std::exp(l - merged), wb = std::exp(lb - merged);
          float* a = buf.acc + g.Local(b, t) * g.C + size_t(h) * hs;
          const E* o = buf.out + (size_t(b) * W + g.T + t) * g.C + size_t(h) * hs;
          for (int d = 0; d < hs; ++d) a[d] = a[d] * wa + ToFloat(o[d]) * wb;
          l = merged;
        }
      }
    step.Wait(timeout_s, "the context-parallel ring's keys and values", stats);
  }
  for (size_t i = 0; i < size_t(g.B) * g.T * g.C; ++i) out[i] = FromFloat<E>(buf.acc[i]);
}

template <typename E>
void RingBackward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                  const Geometry& g, const CpBuffers<E>& buf, E* dqkv, const E* dout, const E* qkv,
                  const E* out, const float* lse, CpStats* stats) {
  const int W = 2 * g.T;
  const size_t n = g.kv_elems(), kv_bytes = n * sizeof(E), dkv_bytes = n * sizeof(float);
  const int next = (g.rank + 1) % g.cp, prev = (g.rank + g.cp - 1) % g.cp;
  PackKv(g, qkv, buf.kv[0]);
  RingBlock(g, buf, qkv);
  BackwardRows(g, buf, W, dout, out, lse, [&](int, int t) { return size_t(g.T + t); });
  std::fill(buf.acc, buf.acc + size_t(g.B) * g.T * g.C, 0.0f);
  // The gradients of the keys and values held at step s travel in dkv[s % 2]: from the previous
  // rank (which added its part at step s - 1), on to the next after this rank adds its part;
  // after cp steps every rank's are home. A buffer is received into again only once its last
  // send is over.
  std::unique_ptr<parallel::Work> dkv_sent[2];
  auto receive = [&](int i) {
    if (dkv_sent[i]) {
      stats->wait_ms += parallel::WaitOrLost(*dkv_sent[i], timeout_s, "a key-value gradient send");
      dkv_sent[i].reset();
    }
    return cp.RecvAsync(buf.dkv[i], dkv_bytes, prev, kTagDkv);
  };
  const char* what = "the context-parallel ring's key and value gradients";
  for (int s = 0, cur = 0; s < g.cp; ++s, cur ^= 1) {
    const int v = (g.rank - s + g.cp) % g.cp, d = s % 2;
    RingStep step;
    if (s + 1 < g.cp) step.Post(cp, buf.kv[cur], buf.kv[cur ^ 1], kv_bytes, kTagKv, stats);
    std::unique_ptr<parallel::Work> incoming;
    if (s > 0) incoming = receive(d);
    RingVisit(g, buf, buf.kv[cur], v);
    // A row that sees none of v's keys sees its stand-in key (score 0) against its final
    // statistic: exp(0 - lse) overflows where lse < -88, and inf·0 is NaN. A statistic of +inf
    // makes its probability 0 in this block, and the real one comes back where it sees keys.
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        const bool sees = Sees(g, buf, b, t);
        for (int h = 0; h < g.NH; ++h)
          buf.lse[(size_t(b) * g.NH + h) * W + g.T + t] =
              sees ? lse[(size_t(b) * g.NH + h) * g.T + t] : kNever;
      }
    be.AttentionBackward(buf.dqkv, buf.dout, buf.qkv, buf.out, buf.lse, g.B, W, g.C, g.NH, g.NKV,
                         buf.doc, buf.end);
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        const E* dq = buf.dqkv + (size_t(b) * W + g.T + t) * g.S;
        float* a = buf.acc + g.Local(b, t) * g.C;
        for (int c = 0; c < g.C; ++c) a[c] += ToFloat(dq[c]);
      }
    if (incoming)
      stats->wait_ms += parallel::WaitOrLost(*incoming, timeout_s, what);
    else
      std::fill(buf.dkv[d], buf.dkv[d] + n, 0.0f);
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        const E* dkv = buf.dqkv + (size_t(b) * W + t) * g.S + g.C;
        float* acc = buf.dkv[d] + g.Local(b, t) * g.KV2;
        for (int c = 0; c < g.KV2; ++c) acc[c] += ToFloat(dkv[c]);
      }
    dkv_sent[d] = cp.SendAsync(buf.dkv[d], dkv_bytes, next, kTagDkv);
    stats->bytes += double(dkv_bytes);
    step.Wait(timeout_s, "the context-parallel ring's keys and values", stats);
  }
  const int home = g.cp % 2;
  auto own = receive(home);
  stats->wait_ms += parallel::WaitOrLost(*own, timeout_s, what);
  for (auto& w : dkv_sent)
    if (w) stats->wait_ms += parallel::WaitOrLost(*w, timeout_s, "a key-value gradient send");
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      E* row = dqkv + g.Local(b, t) * g.S;
      const float* dq = buf.acc + g.Local(b, t) * g.C;
      const float* dkv = buf.dkv[home] + g.Local(b, t) * g.KV2;
      for (int c = 0; c < g.C; ++c) row[c] = FromFloat<E>(dq[c]);
      for (int c = 0; c < g.KV2; ++c) row[g.C + c] = FromFloat<E>(dkv[c]);
    }
}

}  // namespace

template <typename E>
void CpAttentionForward(const kernels::Backend& be, parallel::Comm& cp, CpComm comm,
                        double timeout_s, const CpShape& s, const CpBuffers<E>& buf, E* out,
                        float* lse, const E* qkv, CpStats* stats) {
  KEEL_CHECK(be.host_visible(), "context parallelism runs on the CPU backend only so far");
  const Geometry g(cp, s);
  if (comm == CpComm::kRing) return RingForward(be, cp, timeout_s, g, buf, out, lse, qkv, stats);
  AllGatherForward(be, cp, timeout_s, g, buf, out, lse, qkv, stats);
}

template <typename E>
void CpAttentionBackward(const kernels::Backend& be, parallel::Comm& cp, CpComm comm,
                         double timeout_s, const CpShape& s, const CpBuffers<E>& buf, E* dqkv,
                         const E* dout, const E* qkv, const E* out, const float* lse,
                         CpStats* stats) {
  KEEL_CHECK(be.host_visible(), "context parallelism runs on the CPU backend only so far");
  const Geometry g(cp, s);
  if (comm == CpComm::kRing)
    return RingBackward(be, cp, timeout_s, g, buf, dqkv, dout, qkv, out, lse, stats);
  AllGatherBackward(be, cp, timeout_s, g, buf, dqkv, dout, qkv, out, lse, stats);
}

#define KEEL_CP_INSTANTIATE(E)                                                                   \
  template void CpAttentionForward<E>(const kernels::Backend&, parallel::Comm&, CpComm, double,  \
                                      const CpShape&, const CpBuffers<E>&, E*, float*, const E*, \
                                      CpStats*);                                                 \
  template void CpAttentionBackward<E>(const kernels::Backend&, parallel::Comm&, CpComm, double, \
                                       const CpShape&, const CpBuffers<E>&, E*, const E*,        \
                                       const E*, const E*, const float*, CpStats*);
KEEL_CP_INSTANTIATE(float)
KEEL_CP_INSTANTIATE(bf16)
KEEL_CP_INSTANTIATE(f16)
#undef KEEL_CP_INSTANTIATE

}  // namespace keel::model
