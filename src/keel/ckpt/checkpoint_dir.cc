#include "keel/ckpt/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string_view>

namespace keel::ckpt {
namespace fs = std::filesystem;

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string RankFile(int rank, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.%s", rank, ext);
  return buf;
}

std::optional<int64_t> ParseStepDirName(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step_") != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.size() < 8 || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(digits);
}

namespace {

// The folders of `root` named step_NNNNNNNN followed by `suffix`, oldest first.
std::vector<StepDir> ListWithSuffix(const std::string& root, std::string_view suffix) {
  std::vector<StepDir> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    auto step = ParseStepDirName(name.substr(0, name.size() - suffix.size()));
    if (step && e.is_directory()) out.push_back({*step, name, e.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

}  // namespace

std::vector<StepDir> ListStepDirs(const std::string& root) { return ListWithSuffix(root, ""); }

std::vector<StepDir> ListTmpDirs(const std::string& root) { return ListWithSuffix(root, ".tmp"); }

std::string ReadLatest(const std::string& root) {
  std::ifstream f(root + "/latest");
  std::string name;
  if (!(f >> name)) return "";
  return name;
}

std::string CheckpointRoot(const std::string& run_or_root) {
  const fs::path p(run_or_root);
  if (fs::is_directory(p / "checkpoints")) return (p / "checkpoints").string();
  return run_or_root;
}

}  // namespace keel::ckpt
