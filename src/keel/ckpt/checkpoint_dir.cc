#include "keel/ckpt/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace keel::ckpt {
namespace fs = std::filesystem;

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
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

std::vector<StepDir> ListStepDirs(const std::string& root) {
  std::vector<StepDir> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    auto step = ParseStepDirName(name);
    if (step && e.is_directory()) out.push_back({*step, name, e.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

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
