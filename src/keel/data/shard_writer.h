// Writes a keel-tokens dataset folder (DESIGN.md, "Formats"; dataset_meta.h) one document at a
// time. Each shard is written under a temporary name and renamed when complete; meta.json is
// written last, atomically, so a folder is a valid dataset only once everything in it is.
//
//   keel::data::ShardWriter w("out/train", {.shard_tokens = 1 << 24});
//   for (auto& doc : docs) w.AddDocument(doc);   // doc: tokens, already ending in eos
//   keel::data::DatasetMeta meta = w.Finish();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "keel/data/dataset_meta.h"

namespace keel::data {

struct ShardWriterOptions {
  std::string tokenizer = "gpt2";
  int vocab_size = 50257;
  int eos_id = 50256;
  // A shard is closed at the first document end at or past this many tokens; documents never
  // straddle shards. 2^27 tokens = 256 MiB of uint16.
  uint64_t shard_tokens = uint64_t(1) << 27;
  // Writes a loss mask beside each shard (dataset_meta.h): Append then takes one flag per token.
  bool masked = false;
};

class ShardWriter {
 public:
  // Creates the folder if needed. Removes an existing meta.json first, then stale shard files,
  // so that an interrupted overwrite never looks like a complete dataset.
  ShardWriter(std::string dir, ShardWriterOptions options);
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // Without Finish(): removes the shard in progress and writes no meta.json.
  ~ShardWriter();

  // Appends tokens to the current document (a long document may come in pieces). Throws
  // keel::Error (bad input) for an id outside [0, vocab_size). A masked writer takes `mask`, one
  // flag per token (1: trained on); others ignore it.
  void Append(std::span<const int32_t> tokens, std::span<const uint8_t> mask = {});
  // Ends the current document (it may be empty).
  void EndDocument();
  void AddDocument(std::span<const int32_t> tokens, std::span<const uint8_t> mask = {}) {
    Append(tokens, mask);
    EndDocument();
  }

  // Closes the last shard and writes meta.json, with `record` under "prepare" when given. Tokens
  // appended since the last EndDocument() form a final document.
  DatasetMeta Finish(std::optional<PrepareRecord> record = std::nullopt);

  uint64_t tokens() const;     // written so far, all shards
  uint64_t documents() const;  // ended so far, all shards

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::data
