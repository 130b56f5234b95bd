// The loader's exact state and the prefetcher: a restored loader continues the global sample
// sequence bitwise, whatever the rank count it is restored at; the state survives JSON; a state
// for other data is refused by name; the prefetcher gives exactly the direct loader's batches and
// stops cleanly mid-stream.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/data/loader.h"
#include "keel/data/prefetcher.h"
#include "keel/data/shard_writer.h"

namespace keel::data {
namespace {

constexpr int kT = 8;

// A flat token file whose token i is i mod 50000, so a window's first token names its start.
// 50 samples of T = 8: a global batch of 12 crosses epoch boundaries every few steps.
TokenDataset MakeDataset(const TempDir& dir, size_t n_tokens = kT * 50 + 1) {
  std::vector<uint16_t> t(n_tokens);
  for (size_t i = 0; i < n_tokens; ++i) t[i] = uint16_t(i % 50000);
  const std::string path = dir / "tokens.u16";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(t.data()), std::streamsize(n_tokens * 2));
  return TokenDataset::Open(path);
}

// One step of one rank pulled through the cursor: local_batch() samples in micro-batches.
std::vector<int32_t> NextStep(BatchLoader& l, int micro_batch) {
  std::vector<int32_t> out(size_t(l.local_batch()) * kT), tgt(out.size());
  for (int off = 0; off < l.local_batch(); off += micro_batch)
    l.Next(micro_batch, out.data() + size_t(off) * kT, tgt.data() + size_t(off) * kT);
  return out;
}

std::vector<int32_t> GlobalBatch(const TokenDataset& ds, int gb, int64_t step) {
  BatchLoader one(ds, kT, gb, 0, 1, 7, true);
  std::vector<int32_t> tok(size_t(gb) * kT), tgt(tok.size());
  one.Fill(step, 0, gb, tok.data(), tgt.data());
  return tok;
}

TEST(LoaderState, CursorMatchesFillStepByStep) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  BatchLoader cur(ds, kT, 12, 1, 2, 7, true), fill(ds, kT, 12, 1, 2, 7, true);
  for (int step = 0; step < 30; ++step)
    for (int k = 0; k < 3; ++k) {
      std::vector<int32_t> a(2 * kT), at(a.size()), b(a.size()), bt(a.size());
      cur.Next(2, a.data(), at.data());
      fill.Fill(step, k, 2, b.data(), bt.data());
      ASSERT_EQ(a, b) << "step " << step << " micro " << k;
      ASSERT_EQ(at, bt);
    }
  EXPECT_EQ(cur.state().position, 30u * 12);
}

TEST(LoaderState, RestoreAfterKStepsContinuesBitwise) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  for (int k : {0, 1, 4, 9}) {
    BatchLoader straight(ds, kT, 12, 0, 2, 7, true), first(ds, kT, 12, 0, 2, 7, true);
    for (int s = 0; s < k; ++s) {
      NextStep(straight, 3);
      NextStep(first, 3);
    }
    // Through JSON text, as a checkpoint would hold it.
    const LoaderState st = LoaderStateFromJson(nlohmann::json::parse(ToJson(first.state()).dump()));
    BatchLoader resumed(ds, kT, 12, 0, 2, 7, true);
    resumed.restore(st);
    for (int s = k; s < k + 15; ++s)
      ASSERT_EQ(NextStep(resumed, 3), NextStep(straight, 3)) << "k " << k << " step " << s;
  }
}

TEST(LoaderState, SavedAtTwoRanksRestoresAtOneThreeAndFour) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  const int gb = 12, k = 5;
  std::vector<LoaderState> saved;
  for (int r = 0; r < 2; ++r) {
    BatchLoader l(ds, kT, gb, r, 2, 7, true);
    for (int s = 0; s < k; ++s) NextStep(l, 2);
    saved.push_back(l.state());
  }
  ASSERT_EQ(saved[0], saved[1]) << "the state must not depend on the rank";
  EXPECT_EQ(saved[0].position, uint64_t(k) * gb);

  for (int world : {1, 3, 4}) {
    std::vector<BatchLoader> ranks;
    ranks.reserve(world);
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back(ds, kT, gb, r, world, 7, true);
      ranks.back().restore(saved[0]);
    }
    for (int s = k; s < k + 12; ++s) {
      std::vector<int32_t> got;
      for (auto& l : ranks) {
        auto part = NextStep(l, l.local_batch() % 2 == 0 ? 2 : 1);
        got.insert(got.end(), part.begin(), part.end());
      }
      ASSERT_EQ(got, GlobalBatch(ds, gb, s)) << "world " << world << " step " << s;
    }
  }
}

TEST(LoaderState, JsonRoundTrip) {
  const LoaderState st{
      123456789012345ull, std::numeric_limits<uint64_t>::max(), 1024, 9876543210ull, {}, {}};
  const nlohmann::json j = ToJson(st);
  EXPECT_EQ(j["position"], 123456789012345ull);
  EXPECT_EQ(j["seq_len"], 1024);
  EXPECT_EQ(LoaderStateFromJson(nlohmann::json::parse(j.dump())), st);
}

TEST(LoaderState, BadJsonNamesTheField) {
  nlohmann::json j = ToJson(LoaderState{1, 2, 3, 4, {}, {}});
  j.erase("seq_len");
  try {
    LoaderStateFromJson(j);
    FAIL() << "expected a bad-input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("seq_len"), std::string::npos) << e.what();
  }
  j = ToJson(LoaderState{1, 2, 3, 4, {}, {}});
  j["position"] = "ten";
  try {
    LoaderStateFromJson(j);
    FAIL() << "expected a bad-input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("position"), std::string::npos) << e.what();
  }
}

TEST(LoaderState, MismatchIsRejectedNamingTheField) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  BatchLoader l(ds, kT, 12, 0, 1, 7, true);
  const LoaderState good = l.state();
  struct Case {
    LoaderState st;
    const char* field;
  };
  LoaderState seed = good, seq = good, size = good;
  seed.seed = 8;
  seq.seq_len = 16;
  size.dataset_tokens += 1;
  for (const Case& c : {Case{seed, "seed"}, Case{seq, "seq_len"}, Case{size, "dataset_tokens"}}) {
    try {
      l.restore(c.st);
      FAIL() << "expected a bad-input error for " << c.field;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(what.find(std::string(c.field) + " differs"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
  EXPECT_EQ(l.state(), good) << "a refused restore leaves the loader as it was";
}

// A dataset prepared again with other tokens of the same count (same size, same windows) is
// refused by its shards' hashes; the same tokens prepared again restore. A flat file has no hashes
// and leaves the field out, so its JSON is what it was.
TEST(LoaderState, ADatasetOfOtherTokensOfTheSameSizeIsRefused) {
  TempDir dir;
  auto prepare = [&](const std::string& name, int32_t first) {
    ShardWriter w(dir / name, ShardWriterOptions{});
    std::vector<int32_t> doc(kT * 50);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t(i % 50000);
    doc[0] = first;
    w.AddDocument(doc);
    w.Finish();
    return TokenDataset::Open(dir / name);
  };
  const TokenDataset a = prepare("a", 1), same = prepare("same", 1), other = prepare("other", 2);
  ASSERT_EQ(a.size(), other.size());
  const LoaderState st = BatchLoader(a, kT, 12, 0, 1, 7, true).state();
  EXPECT_EQ(st.content_xxh3.size(), 16u);
  EXPECT_EQ(LoaderStateFromJson(ToJson(st)), st);
  BatchLoader(same, kT, 12, 0, 1, 7, true).restore(st);
  try {
    BatchLoader(other, kT, 12, 0, 1, 7, true).restore(st);
    FAIL() << "expected a bad-input error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("content_xxh3"), std::string::npos) << e.what();
  }
  LoaderState old = st;  // saved before the field existed
  old.content_xxh3.clear();
  BatchLoader(other, kT, 12, 0, 1, 7, true).restore(old);
  TempDir flat_dir;
  const TokenDataset flat = MakeDataset(flat_dir);
  EXPECT_FALSE(ToJson(BatchLoader(flat, kT, 12, 0, 1, 7, true).state()).contains("content_xxh3"));
}

TEST(LoaderState, StateMidStepIsAnError) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  BatchLoader l(ds, kT, 12, 0, 1, 7, true);
  std::vector<int32_t> tok(4 * kT), tgt(tok.size());
  l.Next(4, tok.data(), tgt.data());
  EXPECT_THROW(l.state(), Error);
  l.Next(4, tok.data(), tgt.data());
  l.Next(4, tok.data(), tgt.data());
  EXPECT_EQ(l.state().position, 12u);
}

TEST(Prefetcher, GivesExactlyTheDirectSequence) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  for (int depth : {1, 2, 4}) {
    BatchLoader direct(ds, kT, 12, 1, 3, 7, true), ahead(ds, kT, 12, 1, 3, 7, true);
    Prefetcher pf(ahead, /*micro_batch=*/2, depth);
    for (int step = 0; step < 200; ++step) {
      for (int k = 0; k < 2; ++k) {
        std::vector<int32_t> a(2 * kT), at(a.size()), b(a.size()), bt(a.size());
        const double waited = pf.Next(a.data(), at.data());
        EXPECT_GE(waited, 0.0);
        direct.Fill(step, k, 2, b.data(), bt.data());
        ASSERT_EQ(a, b) << "depth " << depth << " step " << step << " micro " << k;
        ASSERT_EQ(at, bt);
      }
      ASSERT_EQ(pf.state().position, uint64_t(step + 1) * 12);
    }
    EXPECT_GE(pf.total_wait_ms(), 0.0);
  }
}

TEST(Prefetcher, StateRestoresIntoAPlainLoader) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  BatchLoader straight(ds, kT, 12, 0, 1, 7, true), ahead(ds, kT, 12, 0, 1, 7, true);
  LoaderState st;
  {
    Prefetcher pf(ahead, 6, 3);
    std::vector<int32_t> tok(6 * kT), tgt(tok.size());
    for (int i = 0; i < 14; ++i) pf.Next(tok.data(), tgt.data());  // 7 steps
    EXPECT_THROW(
        {
          pf.Next(tok.data(), tgt.data());
          pf.state();
        },
        Error);
    pf.Next(tok.data(), tgt.data());
    st = pf.state();  // 8 steps consumed, whatever was prepared ahead
  }
  EXPECT_EQ(st.position, 8u * 12);
  for (int s = 0; s < 8; ++s) NextStep(straight, 6);
  BatchLoader resumed(ds, kT, 12, 0, 1, 7, true);
  resumed.restore(st);
  for (int s = 0; s < 10; ++s) ASSERT_EQ(NextStep(resumed, 6), NextStep(straight, 6));
}

TEST(Prefetcher, ShutsDownCleanlyMidStream) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  std::vector<int32_t> tok(2 * kT), tgt(tok.size());
  for (int i = 0; i < 50; ++i) {
    BatchLoader l(ds, kT, 12, 0, 1, 7, true);
    Prefetcher pf(l, 2, 1 + i % 4);
    for (int k = 0; k < i % 7; ++k) pf.Next(tok.data(), tgt.data());
  }  // destroyed with the ring full, half full or while the thread is filling
  BatchLoader l(ds, kT, 12, 0, 1, 7, true);
  { Prefetcher never_read(l, 2, 3); }
  SUCCEED();
}

TEST(Prefetcher, BadArgumentsAreRejected) {
  TempDir dir;
  auto ds = MakeDataset(dir);
  BatchLoader l(ds, kT, 12, 0, 1, 7, true);
  EXPECT_THROW(Prefetcher(l, 2, 0), Error);
  EXPECT_THROW(Prefetcher(l, 5, 2), Error);  // 5 does not divide 12
}

}  // namespace
}  // namespace keel::data
