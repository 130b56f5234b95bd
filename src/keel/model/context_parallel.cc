#include "keel/model/context_parallel.h"

#include <cstring>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/zigzag.h"

namespace keel::model {
namespace {

// Row sizes: the fused q, k, v columns (S), the query channels (C), the keys' and values' (KV2).
struct Geometry {
  int cp, rank, B, T, Tw, NH, C, KV2, S;
  Geometry(const parallel::Comm& comm, const CpShape& s)
      : cp(comm.size()),
        rank(comm.rank()),
        B(s.B),
        T(s.T),
        Tw(comm.size() * s.T),
        NH(s.NH),
        C(s.C),
        KV2(2 * s.NKV * (s.C / s.NH)),
        S(s.C + 2 * s.NKV * (s.C / s.NH)) {}
  // Row (b, t) of rank q's local rows, as a row of the whole sequence's (b, position).
  size_t Whole(int q, int b, int t) const {
    return size_t(b) * Tw + size_t(parallel::ZigzagPosition(cp, q, T, t));
  }
  size_t Local(int b, int t) const { return size_t(b) * T + size_t(t); }
};

template <typename E>
void Wait(parallel::Work& w, double timeout_s, const char* what, CpStats* stats) {
  stats->wait_ms += parallel::WaitOrLost(w, timeout_s, what);
}

// Every rank's keys and values into the whole sequence's stand-in q, k, v (this rank's queries
// at their positions, zeros elsewhere), and the document starts that hide the stand-in rows.
template <typename E>
void GatherWhole(parallel::Comm& comm, double timeout_s, const Geometry& g, const CpBuffers<E>& buf,
                 const E* qkv, CpStats* stats) {
  const size_t n = size_t(g.B) * g.T * g.KV2;
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t)
      std::memcpy(buf.kv_local + g.Local(b, t) * g.KV2, qkv + g.Local(b, t) * g.S + g.C,
                  sizeof(E) * g.KV2);
  auto w = comm.AllGatherAsync(buf.kv_local, buf.kv_all, std::vector<size_t>(size_t(g.cp), n),
                               DTypeOf<E>());
  Wait<E>(*w, timeout_s, "a context-parallel all-gather of keys and values", stats);
  stats->bytes += double(n) * (g.cp - 1) * sizeof(E);
  for (int q = 0; q < g.cp; ++q)
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        E* row = buf.qkv + g.Whole(q, b, t) * g.S;
        std::memcpy(row + g.C, buf.kv_all + (size_t(q) * n + g.Local(b, t) * g.KV2),
                    sizeof(E) * g.KV2);
        if (q == g.rank)
          std::memcpy(row, qkv + g.Local(b, t) * g.S, sizeof(E) * g.C);
        else
          std::memset(row, 0, sizeof(E) * g.C);
        buf.doc[g.Whole(q, b, t)] = q == g.rank ? 0 : int32_t(g.Whole(q, b, t) % g.Tw);
      }
}

}  // namespace

template <typename E>
void CpAttentionForward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                        const CpShape& s, const CpBuffers<E>& buf, E* out, float* lse, const E* qkv,
                        CpStats* stats) {
  KEEL_CHECK(be.host_visible(), "context parallelism runs on the CPU backend only so far");
  const Geometry g(cp, s);
  GatherWhole(cp, timeout_s, g, buf, qkv, stats);
  be.AttentionForward(buf.out, buf.lse, buf.qkv, g.B, g.Tw, g.C, g.NH, s.NKV, buf.doc);
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      const size_t w = g.Whole(g.rank, b, t), at = w % g.Tw;
      std::memcpy(out + g.Local(b, t) * g.C, buf.out + w * g.C, sizeof(E) * g.C);
      for (int h = 0; h < g.NH; ++h)
        lse[(size_t(b) * g.NH + h) * g.T + t] = buf.lse[(size_t(b) * g.NH + h) * g.Tw + at];
    }
}

template <typename E>
void CpAttentionBackward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                         const CpShape& s, const CpBuffers<E>& buf, E* dqkv, const E* dout,
                         const E* qkv, const E* out, const float* lse, CpStats* stats) {
  KEEL_CHECK(be.host_visible(), "context parallelism runs on the CPU backend only so far");
  const Geometry g(cp, s);
  GatherWhole(cp, timeout_s, g, buf, qkv, stats);
  // Stand-in rows: no output gradient and no output, so that they add nothing (D = dO·O = 0);
  // a statistic of 0 keeps their one probability finite.
  std::memset(buf.dout, 0, sizeof(E) * size_t(g.B) * g.Tw * g.C);
  std::memset(buf.out, 0, sizeof(E) * size_t(g.B) * g.Tw * g.C);
  std::memset(buf.lse, 0, sizeof(float) * size_t(g.B) * g.NH * g.Tw);
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t) {
      const size_t w = g.Whole(g.rank, b, t), at = w % g.Tw;
      std::memcpy(buf.dout + w * g.C, dout + g.Local(b, t) * g.C, sizeof(E) * g.C);
      std::memcpy(buf.out + w * g.C, out + g.Local(b, t) * g.C, sizeof(E) * g.C);
      for (int h = 0; h < g.NH; ++h)
        buf.lse[(size_t(b) * g.NH + h) * g.Tw + at] = lse[(size_t(b) * g.NH + h) * g.T + t];
    }
  be.AttentionBackward(buf.dqkv, buf.dout, buf.qkv, buf.out, buf.lse, g.B, g.Tw, g.C, g.NH, s.NKV,
                       buf.doc);
  // The queries' gradients are this rank's alone; the keys' and values' go to their owners.
  const size_t n = size_t(g.B) * g.T * g.KV2;
  for (int q = 0; q < g.cp; ++q)
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t) {
        const E* row = buf.dqkv + g.Whole(q, b, t) * g.S;
        std::memcpy(buf.kv_all + (size_t(q) * n + g.Local(b, t) * g.KV2), row + g.C,
                    sizeof(E) * g.KV2);
        if (q == g.rank) std::memcpy(dqkv + g.Local(b, t) * g.S, row, sizeof(E) * g.C);
      }
  auto w = cp.ReduceScatterSumAsync(buf.kv_all, buf.kv_local, std::vector<size_t>(size_t(g.cp), n),
                                    DTypeOf<E>());
  Wait<E>(*w, timeout_s, "a context-parallel reduce-scatter of key and value gradients", stats);
  stats->bytes += double(n) * (g.cp - 1) * sizeof(E);
  for (int b = 0; b < g.B; ++b)
    for (int t = 0; t < g.T; ++t)
      std::memcpy(dqkv + g.Local(b, t) * g.S + g.C, buf.kv_local + g.Local(b, t) * g.KV2,
                  sizeof(E) * g.KV2);
}

#define KEEL_CP_INSTANTIATE(E)                                                                   \
  template void CpAttentionForward<E>(const kernels::Backend&, parallel::Comm&, double,          \
                                      const CpShape&, const CpBuffers<E>&, E*, float*, const E*, \
                                      CpStats*);                                                 \
  template void CpAttentionBackward<E>(const kernels::Backend&, parallel::Comm&, double,         \
                                       const CpShape&, const CpBuffers<E>&, E*, const E*,        \
                                       const E*, const E*, const float*, CpStats*);
KEEL_CP_INSTANTIATE(float)
KEEL_CP_INSTANTIATE(bf16)
KEEL_CP_INSTANTIATE(f16)
#undef KEEL_CP_INSTANTIATE

}  // namespace keel::model
