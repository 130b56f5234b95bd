// TokenDataset: a keel-tokens folder or a flat uint16 file, memory-mapped; see dataset.h.
#include "keel/data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/http_fetch.h"
#include "keel/data/remote_cache.h"
#include "keel/data/remote_shards.h"
#include "keel/data/token_ids.h"

namespace keel::data {
namespace internal {

// TokenDataset::Impl is private; the helpers below work on this base.
struct DatasetState {
  struct Shard {
    std::string path;
    MappedFile tokens;
    MappedFile index;    // empty for a flat file
    MappedFile mask;     // empty unless the dataset is loss-masked
    uint64_t begin = 0;  // global index of its first token
    uint64_t size = 0;
  };
  std::string path;
  int vocab_size = 50257;
  int eos_id = 50256;
  size_t width = 2;  // bytes per token
  std::vector<Shard> shards;
  std::vector<uint64_t> begins;  // shards[i].begin, for binary search
  uint64_t total = 0;
  bool masked = false;

  std::optional<DatasetMeta> meta;  // absent for a flat file
  // Set for an http(s) dataset: its shards' `tokens` stay unmapped, reads go through it.
  std::unique_ptr<RemoteShards> remote;

  // Calls fn(shard, position in it, count) for each shard's part of tokens [start, start + n),
  // in order, skipping empty parts (start + n <= total).
  template <typename Fn>
  void ForEachPiece(uint64_t start, uint64_t n, Fn&& fn) const {
    if (n == 0) return;
    // The last shard whose begin <= start; empty shards share a begin with the next one and are
    // skipped by the loop below.
    size_t si = size_t(std::upper_bound(begins.begin(), begins.end(), start) - begins.begin()) - 1;
    uint64_t pos = start - shards[si].begin;
    for (; n > 0; ++si, pos = 0) {
      const uint64_t take = std::min<uint64_t>(n, shards[si].size - pos);
      if (take > 0) fn(si, pos, take);
      n -= take;
    }
  }

  // Calls fn(bytes) with shard i's token bytes, valid inside the call.
  template <typename Fn>
  void WithTokens(size_t i, Fn&& fn) const {
    if (remote) {
      remote->WithShard(i, fn);
    } else {
      fn(shards[i].tokens.data());
    }
  }
};

}  // namespace internal

struct TokenDataset::Impl : internal::DatasetState {};

namespace {

using internal::DatasetState;

uint64_t ReadU64(const MappedFile& f, uint64_t i) {
  uint64_t v;
  std::memcpy(&v, f.data() + i * 8, 8);
  return v;
}

void OpenFolder(DatasetState* d) {
  const DatasetMeta& meta = d->meta.emplace(ReadDatasetMeta(d->path));
  d->vocab_size = meta.vocab_size;
  d->eos_id = meta.eos_id;
  d->width = meta.token_bytes();
  for (const ShardMeta& sm : meta.shards) {
    DatasetState::Shard s;
    s.path = d->path + "/" + sm.file;
    s.tokens = MappedFile::Open(s.path);
    if (s.tokens.size() != sm.tokens * d->width) {
      ThrowBadInput(s.path + ": expected " + std::to_string(sm.tokens * d->width) + " bytes (" +
                    std::to_string(sm.tokens) + " " + meta.dtype +
                    " tokens per meta.json), found " + std::to_string(s.tokens.size()) +
                    (s.tokens.size() < sm.tokens * d->width ? " (truncated?)" : ""));
    }
    const std::string idx_path = d->path + "/" + sm.index;
    s.index = MappedFile::Open(idx_path);
    if (s.index.size() != (sm.documents + 1) * 8) {
      ThrowBadInput(idx_path + ": expected " + std::to_string((sm.documents + 1) * 8) + " bytes (" +
                    std::to_string(sm.documents) +
                    " document offsets plus the end, uint64), found " +
                    std::to_string(s.index.size()));
    }
    // The first and last entries are cheap to check here; `keel data verify` checks them all.
    if (ReadU64(s.index, 0) != 0 || ReadU64(s.index, sm.documents) != sm.tokens) {
      ThrowBadInput(idx_path + ": expected offsets from 0 to " + std::to_string(sm.tokens) +
                    ", found " + std::to_string(ReadU64(s.index, 0)) + " to " +
                    std::to_string(ReadU64(s.index, sm.documents)));
    }
    if (!sm.mask.empty()) {
      const std::string mask_path = d->path + "/" + sm.mask;
      s.mask = MappedFile::Open(mask_path);
      if (s.mask.size() != sm.tokens)
        ThrowBadInput(mask_path + ": expected " + std::to_string(sm.tokens) +
                      " bytes (one loss-mask flag per token), found " +
                      std::to_string(s.mask.size()));
    }
    s.begin = d->total;
    s.size = sm.tokens;
    d->total += sm.tokens;
    d->shards.push_back(std::move(s));
  }
  d->masked = meta.masked();
}

// An http(s) dataset: meta.json now, each shard when a read first touches it (remote_shards.h),
// cached under $KEEL_CACHE_DIR within $KEEL_CACHE_BYTES. path() and messages name the URL.
void OpenRemote(DatasetState* d) {
  internal::RemoteShardsOptions options;
  options.cache = DefaultRemoteCacheOptions(d->path);
  d->remote = std::make_unique<internal::RemoteShards>(d->path, std::move(options));
  const DatasetMeta& meta = d->meta.emplace(d->remote->meta());
  if (meta.masked())
    ThrowBadInput(d->path +
                  "/meta.json: a loss-masked dataset is read from a local folder only so far "
                  "(copy it, or prepare it with --format text)");
  d->vocab_size = meta.vocab_size;
  d->eos_id = meta.eos_id;
  d->width = meta.token_bytes();
  for (const ShardMeta& sm : meta.shards) {
    DatasetState::Shard s;
    s.path = d->remote->url() + "/" + sm.file;
    s.begin = d->total;
    s.size = sm.tokens;
    d->total += sm.tokens;
    d->shards.push_back(std::move(s));
  }
}

void OpenFlat(DatasetState* d) {
  DatasetState::Shard s;
  s.path = d->path;
  s.tokens = MappedFile::Open(d->path);
  if (s.tokens.size() % 2 != 0) {
    ThrowBadInput(d->path +
                  ": expected a flat file of uint16 tokens (an even number of bytes), "
                  "found " +
                  std::to_string(s.tokens.size()) + " bytes");
  }
  s.size = s.tokens.size() / 2;
  d->total = s.size;
  d->shards.push_back(std::move(s));
}

}  // namespace

TokenDataset TokenDataset::Open(const std::string& path) {
  auto d = std::make_unique<Impl>();
  d->path = path;
  if (IsHttpUrl(path)) {
    OpenRemote(d.get());
    for (const auto& s : d->shards) d->begins.push_back(s.begin);
    return TokenDataset(std::move(d));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    ThrowBadInput(path +
                  ": not found: expected a keel-tokens folder (with meta.json) or a flat "
                  "file of uint16 tokens");
  }
  if (S_ISDIR(st.st_mode)) {
    OpenFolder(d.get());
  } else {
    OpenFlat(d.get());
  }
  for (const auto& s : d->shards) d->begins.push_back(s.begin);
  return TokenDataset(std::move(d));
}

TokenDataset::TokenDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

size_t TokenDataset::size() const { return impl_->total; }
int TokenDataset::vocab_size() const { return impl_->vocab_size; }
int TokenDataset::eos_id() const { return impl_->eos_id; }
const std::string& TokenDataset::path() const { return impl_->path; }
const DatasetMeta* TokenDataset::meta() const { return impl_->meta ? &*impl_->meta : nullptr; }

void TokenDataset::Read(size_t start, size_t n, int32_t* out) const {
  const Impl& d = *impl_;
  if (start > d.total || n > d.total - start) {
    ThrowRuntime(d.path + ": read of tokens [" + std::to_string(start) + ", " +
                 std::to_string(start + n) + ") past the end (" + std::to_string(d.total) +
                 " tokens)");
  }
  d.ForEachPiece(start, n, [&](size_t si, uint64_t pos, uint64_t take) {
    d.WithTokens(si, [&](const uint8_t* bytes) {
      DecodeTokenIds(bytes + pos * d.width, take, d.width, out);
    });
    out += take;
  });
}

bool TokenDataset::masked() const { return impl_->masked; }

void TokenDataset::ReadMask(size_t start, size_t n, uint8_t* out) const {
  const Impl& d = *impl_;
  KEEL_CHECK(start <= d.total && n <= d.total - start, "TokenDataset::ReadMask past the end");
  if (!d.masked) {
    std::memset(out, 1, n);
    return;
  }
  d.ForEachPiece(start, n, [&](size_t si, uint64_t pos, uint64_t take) {
    std::memcpy(out, d.shards[si].mask.data() + pos, take);
    out += take;
  });
}

std::vector<uint64_t> TokenDataset::DocumentBounds() const {
  const Impl& d = *impl_;
  std::vector<uint64_t> bounds;
  if (!d.meta) return {0, d.total};
  KEEL_CHECK(!d.remote, "TokenDataset::DocumentBounds of a remote dataset");
  for (size_t i = 0; i < d.shards.size(); ++i) {
    const auto& s = d.shards[i];
    for (uint64_t k = 0; k < d.meta->shards[i].documents; ++k)
      bounds.push_back(s.begin + ReadU64(s.index, k));
  }
  bounds.push_back(d.total);
  return bounds;
}

void TokenDataset::CheckIds(int vocab) const {
  const Impl& d = *impl_;
  if (d.remote) {
    // Scanning now would download the whole dataset before the first step; each shard is
    // checked instead when it arrives, before any read of it returns.
    d.remote->CheckIdsOnArrival(vocab);
    return;
  }
  for (const auto& s : d.shards) CheckTokenIds(s.tokens.data(), s.size, d.width, vocab, s.path);
}

}  // namespace keel::data
