// Inputs found by the fuzz targets (fuzz/, docs/PERFORMANCE.md "Fuzzing") that once crashed, hit
// undefined behaviour or escaped as a non-keel exception; each must now be bad input with a
// one-line message, or read as the format says.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "../bad_input.h"
#include "keel/ckpt/manifest.h"
#include "keel/ckpt/safetensors.h"
#include "train/run_util.h"

namespace keel::ckpt {
namespace {

using test::TempDir;

// A safetensors file: the 8-byte little-endian header length, the header, the data.
std::string WriteSafetensors(const TempDir& dir, const std::string& header,
                             const std::string& data = "") {
  const std::string path = dir / "t.safetensors";
  const uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}

TEST(FuzzRegression, ManifestNumberOverflowIsBadInput) {
  const std::string e = BadInputMessage(
      [] { ManifestFromJsonText(R"({"format": "keel-checkpoint", "version": 1e999})", "m"); });
  EXPECT_NE(e.find("m: not valid JSON"), std::string::npos) << e;
}

TEST(FuzzRegression, SafetensorsHeaderShapesAreBadInput) {
  TempDir dir;
  for (const auto& [header, data, expect] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"[1]", "", "header is not a JSON object"},
           {R"({"__metadata__": [1]})", "", "__metadata__ is not an object"},
           {R"({"__metadata__": {"k": 5}})", "", "__metadata__ \"k\" is not a string"},
           // 2^62 x 2^62 x 4 wraps to 0 elements in 64 bits; -1 x -1 to 1.
           {R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904, 4],
               "data_offsets": [0, 0]}})",
            "", "is negative or too large"},
           {R"({"a": {"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}})",
            std::string(4, '\0'), "is negative or too large"},
           // nlohmann's cast of 4.4e22 to int64 was undefined behaviour.
           {R"({"a": {"dtype": "F32", "shape": [4.4e22], "data_offsets": [0, 4]}})",
            std::string(4, '\0'), "shape: expected integers"},
           {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, -4.5]}})",
            std::string(4, '\0'), "data_offsets: expected integers"},
       }) {
    const std::string path = WriteSafetensors(dir, header, data);
    const std::string e = BadInputMessage([&] { SafetensorsFile::Read(path); });
    EXPECT_NE(e.find(expect), std::string::npos) << header << "\n" << e;
  }
}

// An empty F32 tensor used to memcpy from a null pointer; a writer with nothing to write wrote the
// header "null", which no reader (keel's included) takes for a safetensors header.
TEST(FuzzRegression, EmptyTensorsAndEmptyFilesRoundTrip) {
  TempDir dir;
  const std::string path =
      WriteSafetensors(dir, R"({"e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]}})");
  const SafetensorsFile f = SafetensorsFile::Read(path);
  EXPECT_EQ(f.Get("e").shape, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(f.Get("e").data.empty());

  SafetensorsWriter().Write(dir / "empty.safetensors");
  EXPECT_TRUE(SafetensorsFile::Read(dir / "empty.safetensors").tensors().empty());
}

}  // namespace
}  // namespace keel::ckpt
