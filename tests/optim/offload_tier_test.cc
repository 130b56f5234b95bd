// The offload tier: any range reads back what was written (unaligned, across blocks and pieces),
// Stream visits every chunk once in order and keeps what it leaves, a Write between streams is
// not hidden by the chunks read ahead, and AdamW cut into the tier's chunks is Step bitwise
// (stochastic rounding included). The host tier ([offload] host, a GPU's) streams and reads the
// same way, and a ParamStore updating through it (gradients and weights staged through host
// chunks, as on a GPU; here the copies are the CPU's) gives the in-memory store's bits.
#include "keel/optim/offload_tier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "keel/optim/adamw.h"
#include "keel/optim/param_store.h"

namespace keel::optim {
namespace {

std::string Dir() { return testing::TempDir() + "keel_offload_tier_test"; }

TEST(OffloadTier, UnalignedRangesReadBackWhatWasWritten) {
  const size_t n = 3 * 2048 * 300 + 77;  // a short last chunk; pieces longer than the bounce
  OffloadTier tier(Dir(), n, {4, 2}, 2048 * 8);
  std::mt19937 rng(7);
  std::vector<uint32_t> a(n, 0);
  std::vector<uint16_t> b(n, 0);
  for (int round = 0; round < 40; ++round) {
    const size_t lo = rng() % n, len = std::min<size_t>(n - lo, 1 + rng() % (round < 4 ? n : 5000));
    for (size_t i = lo; i < lo + len; ++i) a[i] = uint32_t(rng());
    for (size_t i = lo; i < lo + len; ++i) b[i] = uint16_t(rng());
    tier.Write(0, lo, len, a.data() + lo);
    tier.Write(1, lo, len, b.data() + lo);
  }
  std::vector<uint32_t> ga(n);
  std::vector<uint16_t> gb(n);
  tier.Read(0, 0, n, ga.data());
  tier.Read(1, 0, n, gb.data());
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
  std::vector<uint16_t> piece(13);
  tier.Read(1, n - 13, 13, piece.data());
  EXPECT_EQ(0, std::memcmp(piece.data(), b.data() + n - 13, 26));
}

TEST(OffloadTier, StreamVisitsEachChunkOnceInOrderAndKeepsWhatItLeaves) {
  for (const std::string& dir : {Dir(), std::string()}) {  // a disk, then the host tier
    SCOPED_TRACE(dir.empty() ? "host tier" : "disk tier");
    const size_t n = 2048 * 10 + 5, chunk = 2048 * 2;  // six chunks through three buffers
    OffloadTier tier(dir, n, {4, 4}, chunk);
    EXPECT_EQ(tier.host(), dir.empty());
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = float(i);
    tier.Write(0, 0, n, want.data());
    for (int step = 1; step <= 3; ++step) {
      size_t next = 0;
      tier.Stream([&](void* const* p, size_t lo, size_t k) {
        EXPECT_EQ(lo, next);
        EXPECT_LE(k, chunk);
        next = lo + k;
        auto* x = static_cast<float*>(p[0]);
        auto* y = static_cast<float*>(p[1]);
        for (size_t i = 0; i < k; ++i) {
          x[i] += 1;
          y[i] = x[i] * 2;
        }
      });
      EXPECT_EQ(next, n);
      for (float& w : want) w += 1;
      if (step == 2) {  // between two streams, after the next one's first chunks were read ahead
        for (size_t i = 0; i < 100; ++i) want[i] = -1;
        tier.Write(0, 0, 100, want.data());
      }
    }
    std::vector<float> x(n), y(n);
    tier.Read(0, 0, n, x.data());
    tier.Read(1, 0, n, y.data());
    EXPECT_EQ(x, want);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], want[i] * 2) << i;
  }
}

TEST(OffloadTier, RefusesAFolderItCannotWriteWithItsName) {
  try {
    OffloadTier tier("/proc/keel-no-such-dir", 4096, {4}, 2048);
    FAIL() << "a tier in /proc";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[offload] dir /proc/keel-no-such-dir"), std::string::npos)
        << e.what();
  }
}

// AdamW through the tier's chunks (Begin, then Apply per chunk) against one Step: bf16 moments
// and master-less bf16 weights round stochastically, by element, so the cut must not matter.
TEST(OffloadTier, AdamWInChunksIsStepBitwise) {
  const size_t n = 2048 * 5 + 300;
  std::vector<ParamRange> ranges = {{0, 1000, true}, {1000, 4000, false}, {5000, n - 5000, true}};
  for (size_t i = 0; i < ranges.size(); ++i) ranges[i].stream = 11 + i;
  AdamWHyper h;
  h.bf16_moments = true;
  h.seed = 3;
  std::mt19937 rng(1);
  std::normal_distribution<float> g01;
  std::vector<float> grads(n), master(n);
  for (float& g : grads) g = g01(rng);
  for (float& w : master) w = g01(rng);
  std::vector<bf16> w_one(n), w_cut(n);
  for (size_t i = 0; i < n; ++i) w_one[i] = w_cut[i] = ToBf16(master[i]);

  AdamW one(ranges, n, h);
  AdamW cut(ranges, n, h, kernels::Cpu(), /*own_moments=*/false);
  OffloadTier tier(Dir(), n, {2, 2}, 2048);
  for (int step = 0; step < 3; ++step) {
    one.Step(nullptr, w_one.data(), grads.data(), 1e-2f, 0.5f);
    cut.Begin();
    tier.Stream([&](void* const* p, size_t lo, size_t k) {
      cut.Apply({nullptr, w_cut.data() + lo, p[0], p[1], grads.data() + lo, lo, k}, 1e-2f, 0.5f);
    });
  }
  std::vector<uint16_t> m(n), v(n);
  tier.Read(0, 0, n, m.data());
  tier.Read(1, 0, n, v.data());
  EXPECT_EQ(0, std::memcmp(m.data(), one.m(), 2 * n));
  EXPECT_EQ(0, std::memcmp(v.data(), one.v(), 2 * n));
  EXPECT_EQ(0, std::memcmp(w_cut.data(), w_one.data(), 2 * n));
}

// A store on the host tier against one in memory, over a few updates: bf16 weights with an fp32
// master (offloaded with the moments) and without one (the weights staged both ways), fp32 and
// bf16 gradients, bf16 moments; several chunks, the last one short.
TEST(OffloadTier, HostTierStoreIsTheInMemoryStoresBits) {
  const size_t n = 2048 * 7 + 333;
  std::vector<ParamRange> ranges = {{0, 3000, true}, {3000, n - 3000, false}};
  for (size_t i = 0; i < ranges.size(); ++i) ranges[i].stream = 5 + i;
  std::mt19937 rng(2);
  std::normal_distribution<float> g01;
  std::vector<float> init(n);
  for (float& w : init) w = g01(rng);
  for (bool master : {true, false})
    for (int grad_bytes : {4, 2}) {
      SCOPED_TRACE(std::string(master ? "master" : "no master") + ", gradients " +
                   (grad_bytes == 2 ? "bf16" : "fp32"));
      parallel::StateShape shape;
      shape.total = n;
      shape.working_bytes = 2;
      shape.moment_bytes = 2;
      shape.grad_bytes = grad_bytes;
      shape.master = master;
      AdamWHyper h;
      h.seed = 9;
      auto make = [&](bool host) {
        parallel::StateShape s = shape;
        if (host) {
          s.offload_chunk = 2048 * 2 * 8;  // 8 bytes per element (master and moments): 2 chunks
          s.offload_host = true;
        }
        auto st = std::make_unique<ParamStore>(s, parallel::ParallelDims{}, 0, ranges, h);
        std::vector<bf16> w(n);
        for (size_t i = 0; i < n; ++i) w[i] = ToBf16(init[i]);
        std::memcpy(st->working(), w.data(), 2 * n);
        if (master) st->WriteState(ParamStore::Kind::kMaster, 0, n, init.data());
        return st;
      };
      auto mem = make(false), host = make(true);
      ASSERT_TRUE(host->tier() && host->tier()->host());
      ASSERT_GT(host->tier()->chunk_elems(), 0u);
      EXPECT_LT(host->tier()->chunk_elems(), n);
      EXPECT_EQ(host->bytes().total(), parallel::StateBytesPerRank(
                                           [&] {
                                             parallel::StateShape s = shape;
                                             s.offload_chunk = 2048 * 2 * 8;
                                             s.offload_host = true;
                                             return s;
                                           }(),
                                           {})
                                           .total());
      for (int step = 0; step < 3; ++step) {
        for (ParamStore* st : {mem.get(), host.get()}) {
          std::mt19937 gr(100 + step);
          std::normal_distribution<float> gd;  // its own: a shared one caches a draw
          for (size_t i = 0; i < n; ++i) {
            const float g = gd(gr);
            if (grad_bytes == 2)
              static_cast<bf16*>(st->grads())[i] = ToBf16(g);
            else
              static_cast<float*>(st->grads())[i] = g;
          }
          st->Update(1e-2f, 0.7f);
        }
      }
      EXPECT_EQ(0, std::memcmp(mem->working(), host->working(), 2 * n));
      for (ParamStore::Kind k :
           {ParamStore::Kind::kMaster, ParamStore::Kind::kM, ParamStore::Kind::kV}) {
        const size_t eb = DTypeSize(mem->state_dtype(k));
        std::vector<uint8_t> a(eb * n), b(eb * n);
        mem->ReadState(k, 0, n, a.data());
        host->ReadState(k, 0, n, b.data());
        EXPECT_EQ(a, b) << "state kind " << int(k);
      }
    }
}

}  // namespace
}  // namespace keel::optim
