// VerifyDataset; see verify.h.
#include "keel/data/verify.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/hex.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/http_fetch.h"

namespace keel::data {

bool CheckShardHashes(const std::string& dir, const DatasetMeta& meta,
                      const std::atomic<bool>* stop, uint64_t* bytes) {
  for (const ShardMeta& s : meta.shards)
    for (const auto& [name, want] :
         {std::pair{s.file, s.xxh3}, {s.index, s.index_xxh3}, {s.mask, s.mask_xxh3}}) {
      if (name.empty()) continue;  // no mask
      if (stop && stop->load()) return false;
      const std::string file = dir + "/" + name;
      MappedFile f = MappedFile::Open(file);
      const std::string got = HashHex(XXH3_64bits(f.data(), f.size()));
      if (got != want)
        ThrowBadInput(file + ": xxh3 " + got + ", expected " + want +
                      " (from meta.json): the file is corrupt or was changed after writing");
      if (bytes) *bytes += f.size();
    }
  return true;
}

VerifySummary VerifyDataset(const std::string& path) {
  // Open first: it gives the clear error for a missing meta.json, wrong sizes, a flat file.
  TokenDataset ds = TokenDataset::Open(path);
  VerifySummary sum;
  sum.tokens = ds.size();
  struct stat st {};
  if (IsHttpUrl(path)) {
    // Each shard's files are checked against their xxh3 as they download, and its ids as it is
    // mapped; the index entries are checked for local folders only.
    const DatasetMeta& meta = *ds.meta();
    sum.shards = meta.shards.size();
    sum.documents = meta.documents();
    for (const ShardMeta& s : meta.shards) {
      sum.bytes += s.tokens * meta.token_bytes() + (s.documents + 1) * 8;
    }
    ds.CheckIds(ds.vocab_size());  // from here on, on arrival: read everything to fetch it all
    std::vector<int32_t> buf(1 << 20);
    for (size_t i = 0; i < ds.size(); i += buf.size()) {
      ds.Read(i, std::min(buf.size(), ds.size() - i), buf.data());
    }
    return sum;
  } else if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    const DatasetMeta meta = ReadDatasetMeta(path);
    CheckShardHashes(path, meta, nullptr, &sum.bytes);
    for (const ShardMeta& s : meta.shards) {
      MappedFile idx = MappedFile::Open(path + "/" + s.index);
      uint64_t prev = 0;
      for (uint64_t i = 0; i <= s.documents; ++i) {
        uint64_t v;
        std::memcpy(&v, idx.data() + i * 8, 8);
        if (v < prev || v > s.tokens) {
          ThrowBadInput(path + "/" + s.index + ": entry " + std::to_string(i) + " is " +
                        std::to_string(v) + ": expected offsets non-decreasing within [" +
                        std::to_string(prev) + ", " + std::to_string(s.tokens) + "]");
        }
        prev = v;
      }
      if (!s.mask.empty()) {
        MappedFile mask = MappedFile::Open(path + "/" + s.mask);
        const auto* bad =
            std::find_if(mask.data(), mask.data() + mask.size(), [](uint8_t f) { return f > 1; });
        if (bad != mask.data() + mask.size())
          ThrowBadInput(path + "/" + s.mask + ": byte " + std::to_string(bad - mask.data()) +
                        " is " + std::to_string(*bad) + ": expected 0 or 1 (a loss-mask flag)");
      }
      ++sum.shards;
      sum.documents += s.documents;
    }
  } else {
    sum.shards = 1;
    sum.bytes = ds.size() * 2;
  }
  ds.CheckIds(ds.vocab_size());
  return sum;
}

}  // namespace keel::data
