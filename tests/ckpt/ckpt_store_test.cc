// The checkpoint store below the trainer: the writer's commit protocol, the reader's global view
// (a state written by N ranks reads back on any layout), integrity checks and retention.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "../bad_input.h"
#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/manifest.h"
#include "keel/ckpt/reader.h"
#include "keel/ckpt/retention.h"
#include "keel/ckpt/writer.h"
#include "keel/core/error.h"
#include "keel/model/params.h"

namespace keel::ckpt {
namespace {
namespace fs = std::filesystem;

struct Dir {
  Dir() {
    path = fs::temp_directory_path() /
           ("keel_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
  fs::path path;
  static inline int counter = 0;
};

// A small "model": odd shapes, a tensor with fewer rows than ranks, and a 1-D one.
struct Fake {
  std::vector<TensorSpec> specs = {{"wte", {13, 7}, 0}, {"bias", {5}, 91}, {"tiny", {2, 3}, 96}};
  size_t total = 102;
  std::vector<float> master, m, v;
  explicit Fake(float seed) : master(total), m(total), v(total) {
    for (size_t i = 0; i < total; ++i) {
      master[i] = seed + float(i);
      m[i] = -seed - float(i);
      v[i] = seed * 0.5f + float(i);
    }
  }
  StateView View(int64_t step) {
    StateView s;
    s.step = step;
    s.tokens = uint64_t(step) * 100;
    s.state = {{"loader", {{"position", step * 4}}}};
    s.tensors = specs;
    s.buffers = {{"master", master.data()}, {"adam_m", m.data()}, {"adam_v", v.data()}};
    return s;
  }
};

// Saves `fake` as `world` ranks would: each rank's writer writes its slice, then rank 0 commits.
void SaveAsRanks(const std::string& root, Fake& fake, int64_t step, int world,
                 Retention keep = {}) {
  std::vector<std::unique_ptr<CheckpointWriter>> ws;
  for (int r = 0; r < world; ++r)
    ws.push_back(std::make_unique<CheckpointWriter>(root, r, world, keep));
  for (auto& w : ws) w->Begin(fake.View(step));
  for (auto& w : ws) ASSERT_EQ(w->WaitWritten(), CheckpointWriter::kWritten);
  for (auto& w : ws) w->Commit();
  for (auto& w : ws) w->Drain();
  for (auto& w : ws)
    for (const auto& rep : w->TakeReports()) EXPECT_EQ(rep.error, "") << rep.error;
}

TEST(CkptStore, WrittenByNRanksReadsBackWholeOnAnyLayout) {
  for (int world : {1, 2, 3, 4}) {
    Dir d;
    Fake fake(1.5f);
    SaveAsRanks(d.str(), fake, 20, world);
    const std::string dir = d.str() + "/step_00000020";
    EXPECT_EQ(ReadLatest(d.str()), "step_00000020");
    EXPECT_FALSE(fs::exists(dir + ".tmp"));
    for (int r = 0; r < world; ++r) {
      char name[32];
      std::snprintf(name, sizeof name, "/rank_%05d.bin", r);
      EXPECT_TRUE(fs::exists(dir + name)) << name;
    }
    CheckpointReader reader = CheckpointReader::Open(dir);
    EXPECT_EQ(reader.manifest().step, 20);
    EXPECT_EQ(reader.manifest().state["layout"]["dp"], world);
    // Each rank wrote about 1/world of the bytes: save bandwidth grows with ranks.
    std::map<std::string, uint64_t> per_file;
    for (const auto& t : reader.manifest().tensors)
      for (const auto& p : t.pieces) per_file[p.file] += p.bytes;
    EXPECT_EQ(per_file.size(), size_t(world));
    for (const auto& [file, bytes] : per_file)
      EXPECT_LE(bytes, 3 * 4 * (fake.total / world + 3 * 7)) << file;

    Fake back(0.0f);
    std::fill(back.master.begin(), back.master.end(), 0.0f);
    reader.Load(back.specs, {{"master", back.master.data()}, {"adam_v", back.v.data()}});
    EXPECT_EQ(back.master, fake.master) << "world " << world;
    EXPECT_EQ(back.v, fake.v) << "world " << world;
    EXPECT_EQ(Verify(dir).status, "committed");
  }
}

// Own tensors (a DiLoCo replica's state) load by their name, or else by a stand-in pattern: the
// state of the replica saved as r of another number of replicas.
TEST(CkptStore, OwnTensorsLoadByNameOrByAStandInOfTheSameSize) {
  Dir d;
  Fake fake(1.0f);
  std::vector<std::vector<float>> mine = {{1, 2, 3}, {4, 5, 6}};
  std::vector<std::unique_ptr<CheckpointWriter>> ws;
  for (int r = 0; r < 2; ++r)
    ws.push_back(std::make_unique<CheckpointWriter>(d.str(), r, 2, Retention{}));
  for (int r = 0; r < 2; ++r) {
    StateView v = fake.View(7);
    v.own = {{"x.dp" + std::to_string(r) + "of2", mine[r].data(), 3, false, ""}};
    ws[r]->Begin(v);
  }
  for (auto& w : ws) ASSERT_EQ(w->WaitWritten(), CheckpointWriter::kWritten);
  for (auto& w : ws) w->Commit();
  for (auto& w : ws) w->Drain();
  const CheckpointReader reader = CheckpointReader::Open(d.str() + "/step_00000007");
  std::vector<float> a(3, -1), b(3, -1), c(3, -1), e(4, -1), f(3, -1);
  const std::vector<std::string> missing = reader.LoadOwn({
      {"x.dp1of2", a.data(), 3, false, ""},          // its own name
      {"x.dp0of1", b.data(), 3, false, "x.dp0of*"},  // replica 0 of a narrower run
      {"x.dp2of3", c.data(), 3, false, "x.dp2of*"},  // a replica the checkpoint lacks
      {"x.dp1of3", e.data(), 4, true, "x.dp1of*"},   // a stand-in of another size
      {"x.dp0of3", f.data(), 3, false, ""},          // no stand-in
  });
  EXPECT_EQ(a, mine[1]);
  EXPECT_EQ(b, mine[0]);
  EXPECT_EQ(c, std::vector<float>(3, 0.0f));
  EXPECT_EQ(e, std::vector<float>(4, -1.0f)) << "kept when missing";
  EXPECT_EQ(f, std::vector<float>(3, 0.0f));
  EXPECT_EQ(missing, (std::vector<std::string>{"x.dp2of3", "x.dp1of3", "x.dp0of3"}));
}

TEST(CkptStore, ReadBoxAssemblesAnySliceFromOverlappingPieces) {
  Dir d;
  Fake fake(3.0f);
  SaveAsRanks(d.str(), fake, 1, 3);  // each rank its third of the flat layout, cut mid-row
  auto reader = CheckpointReader::Open(d.str() + "/step_00000001");
  const TensorEntry* wte = reader.manifest().Find("wte", "master");
  ASSERT_NE(wte, nullptr);
  ASSERT_GE(wte->pieces.size(), 3u);
  // Rows 3..9, columns 2..5: crosses all three pieces, as a tensor-parallel reader would ask.
  std::vector<float> box(7 * 4);
  reader.ReadBox(*wte, {3, 2}, {7, 4}, box.data());
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(box[size_t(r * 4 + c)], fake.master[size_t((3 + r) * 7 + 2 + c)]);
}

TEST(CkptStore, BoxesOfAFlatRangeAreContiguousRunsInOrder) {
  // A 4 x 5 tensor, elements [3, 17): a partial row, two whole rows, a partial row.
  const std::vector<Box> b = BoxesOf({4, 5}, 3, 17);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].start, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(b[0].count, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b[1].start, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(b[1].count, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(b[2].start, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(b[2].count, (std::vector<int64_t>{1, 2}));
  // Every element once, in order, for any range of a 3-d tensor.
  const std::vector<int64_t> shape = {3, 4, 5};
  for (uint64_t a = 0; a <= 60; a += 7)
    for (uint64_t e = a; e <= 60; e += 5) {
      uint64_t next = a;
      for (const Box& x : BoxesOf(shape, a, e)) {
        ASSERT_EQ(x.flat, next);
        uint64_t n = 1, flat = 0;
        for (size_t d = 0; d < 3; ++d) {
          n *= uint64_t(x.count[d]);
          flat = flat * uint64_t(shape[d]) + uint64_t(x.start[d]);
        }
        EXPECT_EQ(n, x.numel);
        EXPECT_EQ(flat, x.flat);
        next += x.numel;
      }
      EXPECT_EQ(next, e) << a << ".." << e;
    }
}

// A manifest is checked against the model its state describes, as resume and verify do: a
// missing tensor, one of another shape, or one the model does not have is refused by name.
TEST(CkptStore, ManifestMustMatchTheModelItDescribes) {
  model::ModelConfig cfg = model::NamedConfig("gpt2-tiny");
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  Manifest m;
  m.state["model"] = ModelConfigToJson(cfg);
  for (const char* kind : {"master", "adam_m"})
    for (const TensorSpec& t : TensorSpecs(layout))
      m.tensors.push_back({t.name, kind, "f32", t.shape, {}});
  EXPECT_NO_THROW(CheckManifestModel(m, "ck"));
  Manifest missing = m;
  missing.tensors.erase(missing.tensors.begin() + 5);
  std::string msg = BadInputMessage([&] { CheckManifestModel(missing, "ck"); });
  EXPECT_NE(msg.find("ck/manifest.json: no tensor " + m.tensors[5].name + " (master)"),
            std::string::npos)
      << msg;
  Manifest reshaped = m;
  reshaped.tensors[2].shape = {7};
  msg = BadInputMessage([&] { CheckManifestModel(reshaped, "ck"); });
  EXPECT_NE(msg.find("has shape [7]"), std::string::npos) << msg;
  Manifest extra = m;
  extra.tensors.push_back({"h.9.ln_1.weight", "master", "f32", {32}, {}});
  msg = BadInputMessage([&] { CheckManifestModel(extra, "ck"); });
  EXPECT_NE(msg.find("tensor h.9.ln_1.weight (master) is not part of the model"), std::string::npos)
      << msg;
  model::ModelConfig smaller = cfg;
  smaller.n_layer = 1;
  msg = BadInputMessage([&] { CheckSameModel(m, smaller, "ck"); });
  EXPECT_NE(msg.find("model.n_layer = 2 there, 1 in this run's config"), std::string::npos) << msg;
}

// A tensor-parallel shard's slice [lo, hi) is the shard's elements in order, each in its place in
// the whole tensor: checked element by element against model::ForEachShardRun (the mapping the
// trainer copies weights with), for c_attn's 3 blocks cut by rows and c_proj's cut by columns,
// every rank of tp 2 and 3, and ranges that start and end mid-row (ZeRO slices).
TEST(CkptStore, TensorParallelShardBoxesLandInTheWholeTensor) {
  struct Cut {
    std::vector<int> whole;
    int axis;
    std::vector<int> blocks;  // empty: one
  };
  // The last: a Llama qkv adapter's rows under grouped-query attention (q 8, k 4, v 4).
  for (const Cut& c : {Cut{{12, 4}, 0, {4, 4, 4}}, Cut{{12}, 0, {4, 4, 4}}, Cut{{4, 12}, 1, {}},
                       Cut{{12, 5}, 0, {}}, Cut{{16, 3}, 0, {8, 4, 4}}})
    for (int tp : {2, 3, 4}) {
      bool even = c.whole[size_t(c.axis)] % tp == 0;
      for (int b : c.blocks) even = even && b % tp == 0;
      if (!even) continue;
      for (int r = 0; r < tp; ++r) {
        model::ParamInfo p;
        p.global_shape = c.whole;
        p.shape = c.whole;
        p.shape[size_t(c.axis)] /= tp;
        p.numel = 1;
        for (int d : p.shape) p.numel *= size_t(d);
        p.tp_axis = c.axis;
        p.tp_blocks = c.blocks;
        std::vector<uint64_t> want(p.numel);  // local element → its index in the whole tensor
        model::ForEachShardRun(p, tp, r, [&](size_t local, size_t global, size_t n) {
          for (size_t i = 0; i < n; ++i) want[local + i] = global + i;
        });
        TensorSpec t;
        t.shape.assign(c.whole.begin(), c.whole.end());
        t.local_shape.assign(p.shape.begin(), p.shape.end());
        t.offset = 100;
        t.tp_axis = c.axis, t.tp_rank = r;
        t.tp_blocks.assign(c.blocks.begin(), c.blocks.end());
        for (size_t lo = 0; lo <= p.numel; lo += 3)
          for (size_t hi = lo; hi <= p.numel; hi += 5) {
            uint64_t next = lo;
            for (const Box& x : TensorBoxesIn(t, 100 + lo, 100 + hi)) {
              ASSERT_EQ(x.flat, next);
              // The box's elements in row-major order, as global indices.
              std::vector<int64_t> at = x.start;
              for (uint64_t i = 0; i < x.numel; ++i) {
                uint64_t g = 0;
                for (size_t d = 0; d < at.size(); ++d)
                  g = g * uint64_t(t.shape[d]) + uint64_t(at[d]);
                ASSERT_EQ(g, want[x.flat + i])
                    << "tp " << tp << " rank " << r << " [" << lo << ", " << hi << ")";
                for (size_t d = at.size(); d-- > 0;) {
                  if (++at[d] < x.start[d] + x.count[d]) break;
                  at[d] = x.start[d];
                }
              }
              next += x.numel;
            }
            EXPECT_EQ(next, std::max(lo, hi));
          }
      }
    }
}

TEST(CkptStore, CorruptByteIsReportedWithTensorAndFile) {
  Dir d;
  Fake fake(2.0f);
  SaveAsRanks(d.str(), fake, 5, 2);
  const std::string dir = d.str() + "/step_00000005";
  {
    std::fstream f(dir + "/rank_00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    char c = 0x5a;
    f.write(&c, 1);
  }
  VerifyResult v = Verify(dir);
  EXPECT_EQ(v.status, "corrupt");
  ASSERT_EQ(v.bad.size(), 1u);
  EXPECT_EQ(v.bad[0].file, "rank_00001.bin");
  EXPECT_EQ(v.bad[0].tensor, "wte");
  EXPECT_NE(v.bad[0].problem.find("xxh3"), std::string::npos);
  Fake back(0.0f);
  try {
    CheckpointReader::Open(dir).Load(back.specs, {{"master", back.master.data()}});
    FAIL() << "a corrupt piece loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank_00001.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("wte (master)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
  }
}

// One line each for what a reader must refuse before trusting a byte.
TEST(CkptStore, BadCheckpointsGetOneClearLine) {
  Dir d;
  Fake fake(1.0f);
  SaveAsRanks(d.str(), fake, 7, 2);
  const std::string dir = d.str() + "/step_00000007";
  const std::string manifest = dir + "/manifest.json";
  std::string good;
  {
    std::ifstream f(manifest);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto rewrite = [&](const std::string& text, bool fix_commit) {
    std::ofstream(manifest) << text;
    if (fix_commit)
      std::ofstream(dir + "/COMMIT") << "xxh3 " << HashHex(Hash(text.data(), text.size())) << "\n";
  };
  auto error_of = [&] {
    try {
      CheckpointReader::Open(dir).Load(fake.specs, {{"master", fake.master.data()}});
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // Each case edits the good manifest (as JSON, so the layout of the text does not matter).
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = nlohmann::json::parse(good);
    f(j);
    return j.dump(1);
  };
  struct Case {
    std::string name, text, expect;
    bool fix_commit;
  };
  const std::vector<Case> cases = {
      {"edited manifest", edit([](auto& j) { j["step"] = 8; }), "does not match COMMIT", false},
      {"not JSON", "{ \"format\": ", "not valid JSON", true},
      {"wrong format", edit([](auto& j) { j["format"] = "other"; }),
       "format: expected \"keel-checkpoint\"", true},
      {"wrong version", edit([](auto& j) { j["version"] = 9; }),
       "version: this keel reads versions 1 to 2, got 9", true},
      {"missing step", edit([](auto& j) { j.erase("step"); }), "missing key \"step\"", true},
      {"piece outside", edit([](auto& j) { j["tensors"][0]["shape"][0] = 3; }), "outside the shape",
       true},
      {"bytes mismatch", edit([](auto& j) { j["tensors"][0]["pieces"][0]["bytes"] = 4; }),
       "does not match the box", true},
      {"bad hash", edit([](auto& j) { j["tensors"][0]["pieces"][0]["xxh3"] = "xyz"; }),
       "expected 16 lowercase hex digits", true},
      {"escaping file", edit([](auto& j) { j["tensors"][0]["pieces"][0]["file"] = "../x.bin"; }),
       "expected a file name inside the checkpoint", true},
  };
  for (const Case& c : cases) {
    rewrite(c.text, c.fix_commit);
    const std::string msg = error_of();
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg;
  }
  rewrite(good, true);
  EXPECT_EQ(error_of(), "(no error)");
  // Shape mismatch with the model: names the tensor and both shapes.
  Fake other(1.0f);
  other.specs[0].shape = {13, 8};
  try {
    CheckpointReader::Open(dir).Load(other.specs, {{"master", other.master.data()}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "wte (master) has shape [13, 7], the model config expects [13, 8]"),
              std::string::npos)
        << e.what();
  }
  // A missing piece file.
  fs::remove(dir + "/rank_00001.bin");
  EXPECT_NE(error_of().find("rank_00001.bin: missing or unreadable"), std::string::npos);
  EXPECT_EQ(Verify(dir).bad.front().problem, "missing file");
  // No COMMIT: never trusted.
  fs::remove(dir + "/COMMIT");
  EXPECT_NE(error_of().find("never committed"), std::string::npos);
  EXPECT_EQ(Verify(dir).status, "incomplete");
}

TEST(CkptStore, RetentionKeepsLastKEveryMAndLatest) {
  Dir d;
  Fake fake(1.0f);
  for (int64_t step : {10, 20, 30, 40, 50, 60}) SaveAsRanks(d.str(), fake, step, 1, {2, 20});
  std::vector<int64_t> steps;
  for (const auto& s : ListStepDirs(d.str())) steps.push_back(s.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{20, 40, 50, 60}));
  // A leftover .tmp of an older step goes; a newer one (another rank's save in flight) stays.
  fs::create_directories(d.str() + "/step_00000055.tmp");
  fs::create_directories(d.str() + "/step_00000070.tmp");
  ApplyRetention(d.str(), 60, {2, 20});
  EXPECT_FALSE(fs::exists(d.str() + "/step_00000055.tmp"));
  EXPECT_TRUE(fs::exists(d.str() + "/step_00000070.tmp"));
}

TEST(CkptStore, FailedWriteLeavesNoCheckpointAndOldOnesIntact) {
  Dir d;
  Fake fake(1.0f);
  SaveAsRanks(d.str(), fake, 1, 1);
  // The next save cannot create its folder: a file sits where step_00000002.tmp would go.
  std::ofstream(d.str() + "/step_00000002.tmp") << "in the way";
  CheckpointWriter w(d.str(), 0, 1, {});
  w.Begin(fake.View(2));
  EXPECT_EQ(w.WaitWritten(), CheckpointWriter::kFailed);
  w.Abort();
  w.Drain();
  auto reports = w.TakeReports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_FALSE(reports[0].error.empty());
  EXPECT_EQ(ReadLatest(d.str()), "step_00000001");
  EXPECT_EQ(Verify(d.str() + "/step_00000001").status, "committed");
  EXPECT_FALSE(fs::exists(d.str() + "/step_00000002"));
}

// Once renamed into place a checkpoint is committed: a failure to name it `latest` (here a
// folder sits where the file goes; a full disk does the same) is reported with the save and
// leaves it, while the save's error path used to remove it.
TEST(CkptStore, AFailureAfterTheRenameKeepsTheCommittedCheckpoint) {
  Dir d;
  Fake fake(1.0f);
  SaveAsRanks(d.str(), fake, 1, 1);
  fs::remove(d.str() + "/latest");
  fs::create_directories(d.str() + "/latest/in_the_way");
  CheckpointWriter w(d.str(), 0, 1, {1, 0});
  w.Begin(fake.View(2));
  ASSERT_EQ(w.WaitWritten(), CheckpointWriter::kWritten);
  w.Commit();
  w.Drain();
  auto reports = w.TakeReports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].error, "");
  EXPECT_NE(reports[0].warning.find("latest"), std::string::npos) << reports[0].warning;
  EXPECT_EQ(reports[0].path, d.str() + "/step_00000002");
  EXPECT_EQ(Verify(d.str() + "/step_00000002").status, "committed");
  EXPECT_EQ(Verify(d.str() + "/step_00000001").status, "committed");  // retention did not run
}

// Saving a step that has a checkpoint already (a resume from an older one) replaces it whole.
TEST(CkptStore, SavingAStepAgainReplacesItsCheckpoint) {
  Dir d;
  Fake first(1.0f), second(5.0f);
  SaveAsRanks(d.str(), first, 3, 2);
  SaveAsRanks(d.str(), second, 3, 1);
  const std::string dir = d.str() + "/step_00000003";
  EXPECT_EQ(Verify(dir).status, "committed");
  CheckpointReader reader = CheckpointReader::Open(dir);
  EXPECT_EQ(reader.manifest().state["layout"]["dp"], 1);
  EXPECT_FALSE(fs::exists(dir + "/rank_00001.bin"));
  Fake back(0.0f);
  reader.Load(back.specs, {{"master", back.master.data()}});
  EXPECT_EQ(back.master, second.master);
  for (const auto& e : fs::directory_iterator(d.str()))
    EXPECT_EQ(e.path().filename().string().rfind("step_00000003.", 0), std::string::npos)
        << "left over: " << e.path();
  EXPECT_FALSE(fs::exists(d.str() + "/.replaced_step_00000003"));
}

TEST(CkptStore, StepDirNames) {
  EXPECT_EQ(StepDirName(20), "step_00000020");
  EXPECT_EQ(ParseStepDirName("step_00000020"), 20);
  EXPECT_FALSE(ParseStepDirName("step_00000020.tmp"));
  EXPECT_FALSE(ParseStepDirName("step_12"));
  EXPECT_FALSE(ParseStepDirName("latest"));
}

}  // namespace
}  // namespace keel::ckpt
