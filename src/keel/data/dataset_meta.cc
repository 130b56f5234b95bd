// Reading and writing keel-tokens meta.json; see dataset_meta.h.
#include "keel/data/dataset_meta.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/hex.h"

namespace keel::data {
namespace {

using nlohmann::json;

// Shard file names are plain names inside the folder: a meta.json must not point elsewhere.
bool IsPlainName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

class MetaReader {
 public:
  explicit MetaReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void Fail(const std::string& key, const std::string& expected) const {
    ThrowBadInput(path_ + ": " + key + ": expected " + expected);
  }
  const json& Get(const json& obj, const std::string& key, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) Fail(where + key, "a value (missing)");
    return *it;
  }
  std::string String(const json& obj, const std::string& key, const std::string& where = "") const {
    const json& v = Get(obj, key, where);
    if (!v.is_string()) Fail(where + key, "a string, got " + v.dump());
    return v.get<std::string>();
  }
  uint64_t Count(const json& obj, const std::string& key, const std::string& where = "") const {
    const json& v = Get(obj, key, where);
    if (!v.is_number_unsigned()) Fail(where + key, "an integer >= 0, got " + v.dump());
    return v.get<uint64_t>();
  }
  bool Bool(const json& obj, const std::string& key, const std::string& where = "") const {
    const json& v = Get(obj, key, where);
    if (!v.is_boolean()) Fail(where + key, "true or false, got " + v.dump());
    return v.get<bool>();
  }

 private:
  std::string path_;
};

}  // namespace

uint64_t DatasetMeta::tokens() const {
  uint64_t n = 0;
  for (const auto& s : shards) n += s.tokens;
  return n;
}

uint64_t DatasetMeta::documents() const {
  uint64_t n = 0;
  for (const auto& s : shards) n += s.documents;
  return n;
}

std::string TokenizerSpec(const DatasetMeta* meta) {
  if (!meta) return "gpt2";
  return meta->tokenizer.rfind("hf:", 0) == 0 ? meta->tokenizer.substr(3) : meta->tokenizer;
}

DatasetMeta ReadDatasetMeta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::string text;
  try {
    text = ReadWholeFile(path);
  } catch (const Error&) {
    ThrowBadInput(path +
                  ": missing or unreadable: expected a keel-tokens dataset (an interrupted "
                  "`keel data prepare` leaves no meta.json)");
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ThrowBadInput(path + ": expected JSON: " + e.what());
  }
  MetaReader r(path);
  if (!j.is_object()) r.Fail("top level", "a JSON object");
  if (r.String(j, "format") != kDatasetFormat) {
    r.Fail("format", std::string("\"") + kDatasetFormat + "\", got " + j["format"].dump());
  }
  if (r.Count(j, "version") != uint64_t(kDatasetVersion)) {
    r.Fail("version", std::to_string(kDatasetVersion) + ", got " + j["version"].dump() +
                          " (written by a newer keel?)");
  }
  DatasetMeta m;
  m.tokenizer = r.String(j, "tokenizer");
  uint64_t vocab = r.Count(j, "vocab_size");
  if (vocab == 0 || vocab > (uint64_t(1) << 31)) r.Fail("vocab_size", "a value in [1, 2^31)");
  m.vocab_size = int(vocab);
  uint64_t eos = r.Count(j, "eos_id");
  if (eos >= vocab) r.Fail("eos_id", "an id < vocab_size " + std::to_string(vocab));
  m.eos_id = int(eos);
  m.dtype = r.String(j, "dtype");
  if (m.dtype != "uint16" && m.dtype != "uint32") {
    r.Fail("dtype", "\"uint16\" or \"uint32\", got \"" + m.dtype + "\"");
  }
  if (m.dtype == "uint16" && vocab > 65536) r.Fail("dtype", "uint32 for a vocab over 65536");
  const json& shards = r.Get(j, "shards", "");
  if (!shards.is_array()) r.Fail("shards", "an array");
  // No real dataset comes near 2^60 tokens (2 EiB of uint16). Above that, readers' byte sizes
  // (tokens x width, (documents + 1) x 8, sums over shards) could wrap around and make a forged
  // count match a small file, and reads would run off its end.
  constexpr uint64_t kMaxCount = uint64_t(1) << 60;
  uint64_t all_tokens = 0, all_documents = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string where = "shards[" + std::to_string(i) + "].";
    const json& s = shards[i];
    if (!s.is_object()) r.Fail(where.substr(0, where.size() - 1), "an object");
    ShardMeta sm;
    sm.file = r.String(s, "file", where);
    sm.index = r.String(s, "index", where);
    if (!IsPlainName(sm.file)) r.Fail(where + "file", "a file name inside the folder");
    if (!IsPlainName(sm.index)) r.Fail(where + "index", "a file name inside the folder");
    sm.tokens = r.Count(s, "tokens", where);
    sm.documents = r.Count(s, "documents", where);
    if (sm.tokens > kMaxCount - all_tokens) r.Fail(where + "tokens", "at most 2^60 in all shards");
    if (sm.documents > kMaxCount - all_documents)
      r.Fail(where + "documents", "at most 2^60 in all shards");
    all_tokens += sm.tokens;
    all_documents += sm.documents;
    sm.xxh3 = r.String(s, "xxh3", where);
    sm.index_xxh3 = r.String(s, "index_xxh3", where);
    if (s.contains("mask")) {
      sm.mask = r.String(s, "mask", where);
      if (!IsPlainName(sm.mask)) r.Fail(where + "mask", "a file name inside the folder");
      sm.mask_xxh3 = r.String(s, "mask_xxh3", where);
    }
    // A reader that trained some shards masked and others not would change the loss silently.
    if (i > 0 && sm.mask.empty() != m.shards[0].mask.empty())
      r.Fail(where + "mask", std::string("a loss mask on every shard or on none (shards[0] ") +
                                 (m.shards[0].mask.empty() ? "has none)" : "has one)"));
    m.shards.push_back(std::move(sm));
  }
  if (j.contains("prepare")) {
    const json& p = j["prepare"];
    if (!p.is_object()) r.Fail("prepare", "an object");
    PrepareRecord& pr = m.prepare.emplace();
    pr.nfc = r.Bool(p, "nfc", "prepare.");
    pr.on_error = r.String(p, "on_error", "prepare.");
    pr.skipped_lines = r.Count(p, "skipped_lines", "prepare.");
    pr.dropped_short = r.Count(p, "dropped_short", "prepare.");
    pr.dropped_duplicate = r.Count(p, "dropped_duplicate", "prepare.");
    // Absent before loss-masked formats existed: plain text.
    if (p.contains("format")) pr.format = r.String(p, "format", "prepare.");
    if (p.contains("chat_template")) pr.chat_template = r.String(p, "chat_template", "prepare.");
  }
  // The totals are what readers quote and what `data prepare` wrote: both must be there and agree
  // with the shards.
  if (r.Count(j, "tokens") != m.tokens())
    r.Fail("tokens",
           "the sum over shards, " + std::to_string(m.tokens()) + ", got " + j["tokens"].dump());
  if (r.Count(j, "documents") != m.documents())
    r.Fail("documents", "the sum over shards, " + std::to_string(m.documents()) + ", got " +
                            j["documents"].dump());
  return m;
}

std::string DatasetMetaToJson(const DatasetMeta& m) {
  json shards = json::array();
  for (const auto& s : m.shards) {
    json one = {{"file", s.file},           {"index", s.index}, {"tokens", s.tokens},
                {"documents", s.documents}, {"xxh3", s.xxh3},   {"index_xxh3", s.index_xxh3}};
    if (!s.mask.empty()) {
      one["mask"] = s.mask;
      one["mask_xxh3"] = s.mask_xxh3;
    }
    shards.push_back(std::move(one));
  }
  json j = {{"format", kDatasetFormat},   {"version", kDatasetVersion}, {"tokenizer", m.tokenizer},
            {"vocab_size", m.vocab_size}, {"eos_id", m.eos_id},         {"dtype", m.dtype},
            {"tokens", m.tokens()},       {"documents", m.documents()}, {"shards", shards}};
  if (m.prepare) {
    j["prepare"] = {{"nfc", m.prepare->nfc},
                    {"on_error", m.prepare->on_error},
                    {"skipped_lines", m.prepare->skipped_lines},
                    {"dropped_short", m.prepare->dropped_short},
                    {"dropped_duplicate", m.prepare->dropped_duplicate}};
    // Plain text writes neither, so its meta.json reads as before loss-masked formats.
    if (m.prepare->format != "text") j["prepare"]["format"] = m.prepare->format;
    if (!m.prepare->chat_template.empty()) j["prepare"]["chat_template"] = m.prepare->chat_template;
  }
  return j.dump(2) + "\n";
}

}  // namespace keel::data
