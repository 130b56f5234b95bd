#include "keel/ckpt/retention.h"

#include <filesystem>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/fault.h"

namespace keel::ckpt {
namespace fs = std::filesystem;

std::vector<std::string> ApplyRetention(const std::string& root, int64_t current,
                                        const Retention& policy) {
  std::vector<std::string> deleted;
  const std::vector<StepDir> dirs = ListStepDirs(root);
  const std::string latest = ReadLatest(root);
  const int64_t n = int64_t(dirs.size());
  for (int64_t i = 0; i < n; ++i) {
    const StepDir& d = dirs[size_t(i)];
    const bool keep = i >= n - std::max(policy.keep_last, 1) || d.step == current ||
                      d.name == latest ||
                      (policy.keep_every > 0 && d.step % policy.keep_every == 0);
    if (keep || d.step > current) continue;
    std::error_code ec;
    const std::string trash = root + "/.deleting_" + d.name;
    fs::rename(d.path, trash, ec);
    if (ec) continue;
    MaybeCrash("retention");
    fs::remove_all(trash, ec);
    deleted.push_back(d.name);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code rm;
    if (name.rfind(".deleting_", 0) == 0 || name.rfind(".replaced_", 0) == 0) {
      fs::remove_all(e.path(), rm);
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      auto step = ParseStepDirName(name.substr(0, name.size() - 4));
      if (step && *step < current) fs::remove_all(e.path(), rm);
    }
  }
  return deleted;
}

}  // namespace keel::ckpt
