#include "keel/train/shard_check.h"

#include <filesystem>

#include "keel/core/error.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/verify.h"

namespace keel::train {

ShardCheck::ShardCheck(const std::vector<std::string>& paths, uint64_t sync_bytes) {
  std::vector<data::DatasetMeta> metas;
  for (const std::string& p : paths) {
    if (p.empty() || !std::filesystem::exists(std::filesystem::path(p) / "meta.json")) continue;
    dirs_.push_back(p);
    metas.push_back(data::ReadDatasetMeta(p));
    for (const auto& s : metas.back().shards)
      bytes_ += s.tokens * metas.back().token_bytes() + (s.documents + 1) * 8;
  }
  if (bytes_ <= sync_bytes) {
    for (size_t i = 0; i < dirs_.size(); ++i) data::CheckShardHashes(dirs_[i], metas[i]);
    return;
  }
  thread_ = std::thread([this, metas = std::move(metas)] {
    try {
      for (size_t i = 0; i < dirs_.size(); ++i)
        if (!data::CheckShardHashes(dirs_[i], metas[i], &stop_)) return;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      problem_ = e.what();
      failed_ = true;
    }
  });
}

ShardCheck::~ShardCheck() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ShardCheck::ThrowIfFailed() {
  if (!failed_.load()) return;
  std::lock_guard<std::mutex> lock(mu_);
  ThrowBadInput(problem_ + " (found by the run's background check of its shards)");
}

}  // namespace keel::train
