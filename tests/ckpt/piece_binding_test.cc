// Issue 33: a piece's hash binds what it claims to be. A manifest rewritten (and recommitted) with
// two tensors' pieces swapped — h.0.ln_1's weight and bias, the same size — is refused by keel
// ckpt verify and by resume, where before it loaded them swapped. A version 1 manifest (plain
// hashes of the bytes, as keel wrote before) still verifies.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/ckpt/manifest.h"
#include "train/run_util.h"

namespace keel::test {
namespace {

const std::string kKeel = KEEL_BINARY;
const std::string kTiny = std::string(KEEL_SOURCE_DIR) + "/configs/test-tiny.toml";

// Rewrites DIR/manifest.json as `j` and DIR/COMMIT to match it, as a tool that forged it would.
void Recommit(const std::string& dir, const nlohmann::json& j) {
  const std::string text = j.dump(1) + "\n";
  std::ofstream(dir + "/manifest.json", std::ios::binary) << text;
  std::ofstream(dir + "/COMMIT") << "xxh3 " << ckpt::HashHex(ckpt::Hash(text.data(), text.size()))
                                 << "\n";
}

nlohmann::json* Entry(nlohmann::json& m, const std::string& name) {
  for (auto& t : m["tensors"])
    if (t["name"] == name && t["kind"] == "master") return &t;
  return nullptr;
}

TEST(PieceBinding, SwappedPiecesAreRefusedAndVersion1StillReads) {
  TempDir dir;
  const std::string all = ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  ASSERT_GT(all.size(), 200000u);
  std::ofstream(dir / "t.u16", std::ios::binary).write(all.data(), 200000);
  const std::string train =
      "OMP_NUM_THREADS=1 " + kKeel + " train " + kTiny + " --set data.train=" + (dir / "t.u16") +
      " --set train.out_dir=" + dir.path() + " --set checkpoint.every_steps=2";
  ASSERT_EQ(RunCommand(train + " --set train.steps=2").code, 0);
  const std::string step = dir / "test-tiny/checkpoints/step_00000002";
  ASSERT_EQ(RunCommand(kKeel + " ckpt verify " + step).code, 0);
  const nlohmann::json original = nlohmann::json::parse(ReadFile(step + "/manifest.json"));
  EXPECT_EQ(original["version"], 2);

  nlohmann::json swapped = original;
  nlohmann::json *w = Entry(swapped, "h.0.ln_1.weight"), *b = Entry(swapped, "h.0.ln_1.bias");
  ASSERT_TRUE(w && b);
  std::swap((*w)["pieces"], (*b)["pieces"]);
  Recommit(step, swapped);
  const RunResult verify = RunCommand(kKeel + " ckpt verify " + step);
  EXPECT_EQ(verify.code, 2) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("h.0.ln_1.weight (master)"), std::string::npos) << verify.out;
  const RunResult resume =
      RunCommand(train + " --set train.steps=4 --set checkpoint.resume=" + step);
  EXPECT_EQ(resume.code, 2) << resume.err;
  EXPECT_NE(resume.err.find("h.0.ln_1"), std::string::npos) << resume.err;

  // The same checkpoint as keel wrote it before version 2: plain xxh3s of the bytes.
  nlohmann::json v1 = original;
  v1["version"] = 1;
  for (auto& t : v1["tensors"])
    for (auto& p : t["pieces"]) {
      std::ifstream f(step + "/" + p["file"].get<std::string>(), std::ios::binary);
      std::string bytes(p["bytes"].get<size_t>(), '\0');
      f.seekg(p["offset"].get<std::streamoff>());
      f.read(bytes.data(), std::streamsize(bytes.size()));
      p["xxh3"] = ckpt::HashHex(ckpt::Hash(bytes.data(), bytes.size()));
    }
  Recommit(step, v1);
  const RunResult old = RunCommand(kKeel + " ckpt verify " + step);
  EXPECT_EQ(old.code, 0) << old.out << old.err;
}

}  // namespace
}  // namespace keel::test
