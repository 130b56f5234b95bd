#include "keel/ckpt/peer_spill.h"

#include <cstdio>
#include <filesystem>

#include "keel/ckpt/manifest.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"

namespace keel::ckpt::peer {
namespace fs = std::filesystem;

std::vector<SpilledItem> Spill::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SpilledItem> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  std::vector<fs::path> drop;
  for (const auto& e : fs::recursive_directory_iterator(dir_, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    const size_t dot = name.rfind('.');
    SpilledItem item;
    bool ok = dot != std::string::npos && name.size() - dot == 17;
    if (ok) {
      try {
        item.xxh3 = ParseHexHash(name.substr(dot + 1), e.path().string());
        item.bytes = ReadWholeFile(e.path().string());
        ok = Hash(item.bytes.data(), item.bytes.size()) == item.xxh3;
      } catch (const Error&) {
        ok = false;
      }
    }
    if (!ok) {
      std::fprintf(stderr,
                   "keel holder: %s: not a whole copy (its bytes do not match its name); "
                   "removed\n",
                   e.path().c_str());
      drop.push_back(e.path());
      continue;
    }
    item.key = fs::relative(e.path(), dir_).string();
    item.key.resize(item.key.size() - 17);
    out.push_back(std::move(item));
  }
  for (const fs::path& p : drop) fs::remove(p, ec);
  return out;
}

void Spill::Write(const std::string& key, const std::string& bytes, uint64_t xxh3) try {
  std::lock_guard<std::mutex> lock(mu_);
  const fs::path path = fs::path(dir_) / (key + "." + HashHex(xxh3));
  fs::create_directories(path.parent_path());
  WriteFileAtomic(path.string(), bytes);
  // Only after the new file is in place: a crash in between leaves two versions, which Load
  // takes in turn (the later one replaces the earlier), never none.
  const std::string stem = path.filename().string().substr(0, path.filename().string().size() - 16);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path.parent_path(), ec)) {
    const std::string n = e.path().filename().string();
    if (n != path.filename().string() && n.size() == stem.size() + 16 && n.rfind(stem, 0) == 0)
      fs::remove(e.path(), ec);
  }
} catch (const std::exception& e) {
  // A full or failing local disk costs this tier, not the copy in memory that was answered OK.
  std::fprintf(stderr, "keel holder: cannot spill %s to %s: %s\n", key.c_str(), dir_.c_str(),
               e.what());
}

void Spill::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const fs::path base = fs::path(dir_) / key;
  const std::string stem = base.filename().string() + ".";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base.parent_path(), ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() == stem.size() + 16 && n.rfind(stem, 0) == 0) fs::remove(e.path(), ec);
  }
  // remove() of a folder fails unless it is empty, which is the point: the step's last file.
  fs::remove(base.parent_path(), ec);
}

}  // namespace keel::ckpt::peer
