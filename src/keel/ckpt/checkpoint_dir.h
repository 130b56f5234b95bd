// Names inside a run's checkpoints/ folder: step_NNNNNNNN (committed), step_NNNNNNNN.tmp (being
// written, or left by a crash), `latest` (the newest committed one's name).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace keel::ckpt {

// "step_00000020"
std::string StepDirName(int64_t step);
// A rank's file in a checkpoint: "rank_00003.bin" (its bytes), "rank_00003.json" (its pieces).
std::string RankFile(int rank, const char* ext);
// The step of "step_00000020" (nullopt for anything else, "step_00000020.tmp" included).
std::optional<int64_t> ParseStepDirName(const std::string& name);

struct StepDir {
  int64_t step = 0;
  std::string name;  // "step_00000020"
  std::string path;  // root + "/" + name
};
// The step_NNNNNNNN folders of `root`, oldest first (none if root does not exist).
std::vector<StepDir> ListStepDirs(const std::string& root);
// The step_NNNNNNNN.tmp folders of `root` (saves in flight or cut short), oldest first; `name`
// keeps the ".tmp".
std::vector<StepDir> ListTmpDirs(const std::string& root);
// The name `latest` holds, or "" if there is no readable `latest`.
std::string ReadLatest(const std::string& root);
// `root` itself when it holds checkpoints, else root/checkpoints when that exists (a run folder).
std::string CheckpointRoot(const std::string& run_or_root);

}  // namespace keel::ckpt
