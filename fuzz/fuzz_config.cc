// Fuzzes the run config: a TOML file plus `--set` overrides (train::LoadConfig), and checks that
// what LoadConfig accepts, ToToml writes back readably and LoadConfig reads to an equal config.
//
// Input: the TOML text, then up to 8 overrides, separated by kSep (fuzz_util.h). An empty TOML
// part means "no file" (LoadConfig's defaults-only path). LoadConfig reads a path, so the text
// goes through a file in /dev/shm: cheaper than a text seam in config.cc, and it also covers
// ParseFile.
#include "fuzz_util.h"
#include "keel/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch dir("config");
  std::vector<std::string> parts = keel::fuzz::SplitParts(data, size, 9);
  const std::string toml = parts[0];
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  const std::string path = toml.empty() ? "" : dir.Write("run.toml", toml);

  keel::fuzz::ExpectOnlyKeelErrors([&] {
    keel::train::RunConfig cfg = keel::train::LoadConfig(path, overrides);
    const std::string written = keel::train::ToToml(cfg);
    const std::string again_path = dir.Write("resolved.toml", written);
    keel::fuzz::ExpectSuccess("reading back ToToml's output", [&] {
      keel::train::RunConfig again = keel::train::LoadConfig(again_path, {});
      again.source = cfg.source;
      keel::fuzz::Check(again == cfg, "LoadConfig(ToToml(cfg)) != cfg; ToToml wrote:\n" + written);
    });
  });
  return 0;
}
