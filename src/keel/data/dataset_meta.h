// The meta.json of a keel-tokens dataset folder (DESIGN.md, "Formats"): what it holds, how it is
// read with errors that name the key, and how it is written. Shared by the reader
// (TokenDataset), the writer (ShardWriter), `keel data inspect` and `keel data verify`.
//
//   {"format": "keel-tokens", "version": 1, "tokenizer": "gpt2", "vocab_size": 50257,
//    "eos_id": 50256, "dtype": "uint16", "tokens": 2048, "documents": 3,
//    "shards": [{"file": "shard_00000.bin", "index": "shard_00000.idx", "tokens": 2048,
//                "documents": 3, "xxh3": "0123456789abcdef", "index_xxh3": "..."}]}
//
// shard_NNNNN.bin holds little-endian tokens of `dtype`; shard_NNNNN.idx holds documents + 1
// little-endian uint64 offsets (in tokens, within the shard): each document's start, then the
// end. xxh3 is XXH3-64 of the file's bytes, as 16 lowercase hex digits.
//
// A loss-masked dataset (`keel data prepare --format chat|prompt-completion`) also has
// shard_NNNNN.mask beside each shard: one byte per token, 1 where the token is a target the loss
// trains on (an assistant's or a completion's), 0 elsewhere; its shards name it under "mask" with
// its "mask_xxh3". Every shard has one or none does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace keel::data {

inline constexpr const char* kDatasetFormat = "keel-tokens";
inline constexpr int kDatasetVersion = 1;

struct ShardMeta {
  std::string file;   // token file name inside the folder
  std::string index;  // document index file name inside the folder
  uint64_t tokens = 0;
  uint64_t documents = 0;
  std::string xxh3;        // of the token file
  std::string index_xxh3;  // of the index file
  std::string mask;        // loss mask file name; empty: every token is trained on
  std::string mask_xxh3;
};

// How `keel data prepare` made the dataset, under "prepare" in meta.json: for people and tools
// that want to know what was dropped. Readers do not need it; a meta.json without it is as valid.
// The counts are of the whole run, train and val together.
struct PrepareRecord {
  bool nfc = false;
  std::string on_error = "stop";  // "stop" or "skip"
  uint64_t skipped_lines = 0;     // bad JSONL lines dropped under "skip"
  uint64_t dropped_short = 0;
  uint64_t dropped_duplicate = 0;
  std::string format = "text";  // "text", "chat" or "prompt-completion"
  std::string chat_template;    // the loss-masked formats' template (chat_format.h)
};

struct DatasetMeta {
  std::string tokenizer = "gpt2";
  int vocab_size = 50257;
  int eos_id = 50256;
  std::string dtype = "uint16";  // "uint16" or "uint32"
  std::vector<ShardMeta> shards;
  std::optional<PrepareRecord> prepare;

  size_t token_bytes() const { return dtype == "uint16" ? 2 : 4; }
  uint64_t tokens() const;
  uint64_t documents() const;
  bool masked() const { return !shards.empty() && !shards[0].mask.empty(); }
};

// Reads DIR/meta.json. Throws keel::Error (bad input) naming the file and key: missing (which is
// what an interrupted write leaves), not JSON, wrong format or version, a key of the wrong type.
DatasetMeta ReadDatasetMeta(const std::string& dir);

std::string DatasetMetaToJson(const DatasetMeta& meta);

// What data::Tokenizer::Load takes for the tokenizer a dataset was prepared with: its meta.json's
// "tokenizer" (a tokenizer.json's "hf:PATH" as PATH); "gpt2" for a flat token file (no meta).
std::string TokenizerSpec(const DatasetMeta* meta);

}  // namespace keel::data
