#include "keel/ckpt/retention.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/fault.h"

namespace keel::ckpt {
namespace fs = std::filesystem;

namespace {

// The older checkpoints whose files `dir`'s manifest references (incremental saves).
std::set<std::string> ReferencedDirs(const std::string& dir) {
  std::set<std::string> out;
  std::ifstream f(dir + "/manifest.json");
  const auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("tensors") || !j["tensors"].is_array()) return out;
  for (const auto& t : j["tensors"]) {
    if (!t.is_object() || !t.contains("pieces") || !t["pieces"].is_array()) continue;
    for (const auto& p : t["pieces"]) {
      if (!p.is_object() || !p.contains("file") || !p["file"].is_string()) continue;
      const std::string file = p["file"];
      if (file.rfind("../", 0) == 0) out.insert(file.substr(3, file.find('/', 3) - 3));
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> ApplyRetention(const std::string& root, int64_t current,
                                        const Retention& policy) {
  std::vector<std::string> deleted;
  const std::vector<StepDir> dirs = ListStepDirs(root);
  const std::string latest = ReadLatest(root);
  const int64_t n = int64_t(dirs.size());
  std::set<std::string> keep;
  for (int64_t i = 0; i < n; ++i) {
    const StepDir& d = dirs[size_t(i)];
    if (i >= n - std::max(policy.keep_last, 1) || d.step >= current || d.name == latest ||
        (policy.keep_every > 0 && d.step % policy.keep_every == 0))
      keep.insert(d.name);
  }
  // A kept checkpoint's referenced files must stay; references point at the folder that holds
  // the bytes, never through another reference, so one pass over the kept ones suffices.
  std::set<std::string> referenced;
  for (const std::string& name : keep)
    for (const std::string& r : ReferencedDirs(root + "/" + name)) referenced.insert(r);
  keep.insert(referenced.begin(), referenced.end());
  for (const StepDir& d : dirs) {
    if (keep.count(d.name)) continue;
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
    if (name.rfind(".deleting_", 0) == 0 || name.rfind(".replaced_", 0) == 0)
      fs::remove_all(e.path(), rm);
  }
  for (const StepDir& t : ListTmpDirs(root)) {
    std::error_code rm;
    if (t.step < current) fs::remove_all(t.path, rm);
  }
  return deleted;
}

}  // namespace keel::ckpt
