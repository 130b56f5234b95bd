// Prepare: the reader (this thread) cuts the input into batches of raw items, worker threads
// parse and tokenize them, and this thread writes finished batches strictly in input order, so
// the output does not depend on the number of workers. Filtering (min_chars, dedup) and the
// train/val split happen at write time, in order, for the same reason.
#include "keel/data/prepare.h"

#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "keel/core/error.h"
#include "keel/core/progress.h"
#include "keel/data/chat_format.h"
#include "keel/data/prepare_input.h"
#include "keel/data/shard_writer.h"
#include "keel/data/tokenizer.h"
#include "keel/data/unicode_nfc.h"

namespace keel::data {
namespace {

using internal::RawItem;

// Batches of about this much text keep the hand-off overhead small and memory bounded.
constexpr size_t kBatchBytes = size_t(1) << 20;
constexpr size_t kBatchItems = 4096;

struct ItemResult {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // loss-masked formats: one flag per token, the eos included
  uint64_t hash = 0;
  uint64_t chars = 0;
  std::string problem;  // a bad JSONL line: "FILE:LINE: expected ..."; reported at write time
};

struct Batch {
  std::vector<RawItem> items;
  std::vector<ItemResult> results;
  bool done = false;
};

// The document text of one JSONL line into *text, or why there is none.
std::string ParseJsonLine(const std::string& line, const std::string& field, std::string* text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    return "invalid JSON (syntax error at byte " + std::to_string(e.byte) + ")";
  } catch (const nlohmann::json::exception& e) {
    // out_of_range for a number no double holds (1e999). Uncaught, it would end the worker
    // thread and so the process (std::terminate), whatever --on-error says.
    return "invalid JSON (" + std::string(e.what()) + ")";
  }
  if (!j.is_object()) return std::string("a JSON ") + j.type_name();
  auto it = j.find(field);
  if (it == j.end()) return "an object without \"" + field + "\"";
  if (!it->is_string()) return "\"" + field + "\" as a " + std::string(it->type_name());
  *text = it->get<std::string>();
  return "";
}

// Parses (JSONL), normalizes (--nfc) and tokenizes one batch. Bad lines are recorded, not
// thrown: they must surface in input order on the writing thread, whichever worker meets them
// first.
// What a format's worker needs besides the options: the parsed format and template.
struct Format {
  DocFormat doc = DocFormat::kText;
  ChatTemplate tmpl = ChatTemplate::kPlain;
};

// A loss-masked format's line: rendered whole (chat_format.h); dedup and min_chars look at the
// JSON line itself.
void ProcessInstruction(const PrepareOptions& o, const Format& f, const Tokenizer& tok,
                        const std::vector<std::string>& files, const RawItem& item, ItemResult* r) {
  const std::string where = files[item.file] + ":" + std::to_string(item.line) + ": ";
  if (item.kind != RawItem::Kind::kJsonLine) {
    r->problem = files[item.file] + ": --format " + o.format + " reads JSONL files (*.jsonl)";
    return;
  }
  const std::string got =
      RenderInstructionLine(item.bytes, f.doc, f.tmpl, tok, &r->tokens, &r->mask);
  if (!got.empty()) {
    r->problem = where + "expected " +
                 (f.doc == DocFormat::kChat ? "{\"messages\": [{\"role\", \"content\"}, ...]}"
                                            : "{\"prompt\": \"...\", \"completion\": \"...\"}") +
                 ", got " + got;
    return;
  }
  r->hash = o.dedup ? XXH3_64bits(item.bytes.data(), item.bytes.size()) : 0;
  r->chars = internal::CountCodePoints(item.bytes.data(), item.bytes.size());
}

void ProcessBatch(const PrepareOptions& o, const Format& f, const Tokenizer& tok,
                  const std::vector<std::string>& files, Batch* b) {
  b->results.resize(b->items.size());
  std::string text, normalized;
  for (size_t i = 0; i < b->items.size(); ++i) {
    RawItem& item = b->items[i];
    ItemResult& r = b->results[i];
    if (f.doc != DocFormat::kText) {
      ProcessInstruction(o, f, tok, files, item, &r);
      if (!r.problem.empty() && o.on_error == PrepareOnError::kStop) return;
      continue;
    }
    std::string_view view = item.bytes;
    if (item.kind == RawItem::Kind::kJsonLine) {
      const std::string got = ParseJsonLine(item.bytes, o.field, &text);
      if (!got.empty()) {
        r.problem = files[item.file] + ":" + std::to_string(item.line) +
                    ": expected a JSON object with a string field \"" + o.field + "\", got " + got;
        // Under kStop the writer throws at this item; the rest of the batch is never written.
        if (o.on_error == PrepareOnError::kStop) return;
        continue;
      }
      view = text;
    }
    // Text pieces of a chunked file are cut between ASCII characters, which NFC never joins, so
    // normalizing piece by piece equals normalizing the whole (see prepare_input.cc).
    if (o.nfc && NormalizeNfc(view, &normalized)) view = normalized;
    if (item.has_stats) {
      r.hash = item.hash;
      r.chars = item.chars;
    } else if (item.first && item.last) {
      r.hash = o.dedup ? XXH3_64bits(view.data(), view.size()) : 0;
      r.chars = internal::CountCodePoints(view.data(), view.size());
    }
    // A short whole document is dropped anyway; don't spend time tokenizing it.
    if (item.first && r.chars < o.min_chars) continue;
    tok.EncodeAppend(view, &r.tokens);
  }
}

// Worker threads over a queue of batches; joined on destruction, also when unwinding.
class Workers {
 public:
  Workers(int n, const PrepareOptions& o, const Format& f, const Tokenizer& tok,
          const std::vector<std::string>& files) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, &o, &f, &tok, &files] {
        while (Batch* b = Take()) {
          ProcessBatch(o, f, tok, files, b);
          std::lock_guard lock(mu_);
          b->done = true;
          done_cv_.notify_all();
        }
      });
    }
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void Submit(Batch* b) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(b);
    }
    work_cv_.notify_one();
  }
  void Wait(const Batch* b) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [b] { return b->done; });
  }

 private:
  Batch* Take() {
    std::unique_lock lock(mu_);
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return nullptr;
    Batch* b = queue_.front();
    queue_.pop_front();
    return b;
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Batch*> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

bool GoesToVal(uint64_t doc_index, const PrepareOptions& o) {
  if (o.val_fraction <= 0) return false;
  uint64_t h = XXH3_64bits_withSeed(&doc_index, sizeof doc_index, o.seed);
  return double(h >> 11) * 0x1.0p-53 < o.val_fraction;
}

// Input bytes in all: known when no input is compressed (the reader counts what it decompresses).
double InputBytes(const std::vector<std::string>& files) {
  double total = 0;
  for (const std::string& f : files) {
    for (const char* ext : {".gz", ".zst", ".zstd", ".xz", ".bz2"})
      if (f.size() > std::strlen(ext) &&
          f.compare(f.size() - std::strlen(ext), std::string::npos, ext) == 0)
        return 0;
    std::error_code ec;
    const auto n = std::filesystem::file_size(f, ec);
    if (ec) return 0;
    total += double(n);
  }
  return total;
}

std::string Counts(const PrepareSummary& s) {
  return FormatAmount(double(s.documents_read), "docs") + ", " +
         FormatAmount(double(s.train_tokens + s.val_tokens), "tokens");
}

}  // namespace

PrepareSummary Prepare(const PrepareOptions& o) {
  if (o.out.empty()) ThrowBadInput("prepare: expected an output folder (--out)");
  if (o.val_fraction < 0 || o.val_fraction >= 1) {
    ThrowBadInput("prepare: --val-fraction: expected a value in [0, 1), got " +
                  std::to_string(o.val_fraction));
  }
  if (o.workers < 1 || o.workers > 1024) {
    ThrowBadInput("prepare: --workers: expected 1..1024, got " + std::to_string(o.workers));
  }
  if (o.shard_tokens == 0) ThrowBadInput("prepare: --shard-tokens: expected a value > 0");
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = o.tokenizer == "gpt2" ? Tokenizer::LoadGpt2(o.tokenizer_dir)
                                              : Tokenizer::Load(o.tokenizer, o.assets);
  Format format;
  format.doc = ParseDocFormat(o.format);
  if (format.doc != DocFormat::kText) format.tmpl = ChooseChatTemplate(o.chat_template, tok);
  internal::InputReader reader(o.inputs, o.text_chunk_bytes, o.nfc);

  ShardWriterOptions wo;
  wo.tokenizer = tok.name();
  wo.vocab_size = tok.vocab_size();
  wo.eos_id = tok.eos_id();
  wo.shard_tokens = o.shard_tokens;
  wo.masked = format.doc != DocFormat::kText;
  ShardWriter train(o.out + "/train", wo);
  std::unique_ptr<ShardWriter> val;
  if (o.val_fraction > 0) {
    val = std::make_unique<ShardWriter>(o.out + "/val", wo);
  } else {
    // A val/ left by an earlier run with another split would silently disagree with train/.
    std::error_code ec;
    std::filesystem::remove(o.out + "/val/meta.json", ec);
  }

  PrepareSummary sum;
  sum.files = reader.files().size();
  std::unordered_set<uint64_t> seen;
  Progress progress("prepare", InputBytes(reader.files()), "B", o.progress);
  ShardWriter* target = nullptr;  // where the current document goes; nullptr when dropped
  const int32_t eos = tok.eos_id();

  // Each document's place in the input, skipped lines included, decides its split: fixing or
  // dropping a bad line does not move any other document between train and val.
  uint64_t input_index = 0;
  auto write = [&](Batch& b) {
    for (size_t i = 0; i < b.items.size(); ++i) {
      const RawItem& item = b.items[i];
      const ItemResult& r = b.results[i];
      if (!r.problem.empty()) {
        if (o.on_error == PrepareOnError::kStop) {
          ThrowBadInput(r.problem + " (--on-error skip drops such lines)");
        }
        if (sum.skipped_lines++ == 0) sum.first_skipped = r.problem;
        ++input_index;
        target = nullptr;
        continue;
      }
      // An empty or blank text file holds no document, as a blank JSONL line does not.
      if (item.first && item.last && item.kind == RawItem::Kind::kText &&
          item.bytes.find_first_not_of(" \t\r\n\f\v") == std::string::npos)
        continue;
      if (item.first) {
        ++sum.documents_read;
        target = GoesToVal(input_index++, o) ? val.get() : &train;
        if (r.chars < o.min_chars) {
          ++sum.dropped_short;
          target = nullptr;
        } else if (o.dedup && !seen.insert(r.hash).second) {
          ++sum.dropped_duplicate;
          target = nullptr;
        }
      }
      if (!target) continue;
      if (wo.masked) {  // the rendered document ends in its own eos
        target->AddDocument(r.tokens, r.mask);
        for (uint8_t m : r.mask) sum.trained_tokens += m;
        continue;
      }
      target->Append(r.tokens);
      if (item.last) target->AddDocument({&eos, 1});
    }
  };

  {
    // Declared before the workers so that it outlives them when an error unwinds this block.
    std::deque<std::unique_ptr<Batch>> inflight;
    Workers workers(o.workers, o, format, tok, reader.files());
    const size_t max_inflight = size_t(o.workers) * 2 + 2;
    RawItem item;
    bool more = true;
    while (more || !inflight.empty()) {
      while (more && inflight.size() < max_inflight) {
        auto b = std::make_unique<Batch>();
        size_t bytes = 0;
        while (bytes < kBatchBytes && b->items.size() < kBatchItems &&
               (more = reader.Next(&item))) {
          bytes += item.bytes.size();
          b->items.push_back(std::move(item));
        }
        if (b->items.empty()) break;
        workers.Submit(b.get());
        inflight.push_back(std::move(b));
      }
      if (inflight.empty()) break;
      workers.Wait(inflight.front().get());
      Batch& b = *inflight.front();
      write(b);
      inflight.pop_front();
      sum.bytes_read = reader.bytes_read();
      sum.train_documents = train.documents();
      sum.train_tokens = train.tokens();
      sum.val_documents = val ? val->documents() : 0;
      sum.val_tokens = val ? val->tokens() : 0;
      progress.Update(double(sum.bytes_read), Counts(sum));
    }
  }
  if (sum.documents_read == 0) {
    // Nothing to train on is a mistake in the input, not a dataset of zero tokens.
    ThrowBadInput(reader.files()[0] +
                  (reader.files().size() > 1
                       ? " (and " + std::to_string(reader.files().size() - 1) + " more files)"
                       : "") +
                  ": no documents: expected non-blank JSONL lines or non-empty text" +
                  (sum.skipped_lines > 0
                       ? " (all " + std::to_string(sum.skipped_lines) + " lines were bad, skipped)"
                       : ""));
  }
  PrepareRecord record;
  record.nfc = o.nfc;
  record.on_error = o.on_error == PrepareOnError::kSkip ? "skip" : "stop";
  record.skipped_lines = sum.skipped_lines;
  record.dropped_short = sum.dropped_short;
  record.dropped_duplicate = sum.dropped_duplicate;
  record.format = o.format;
  if (wo.masked) record.chat_template = ChatTemplateName(format.tmpl);
  train.Finish(record);
  if (val) val->Finish(record);
  sum.bytes_read = reader.bytes_read();
  sum.train_documents = train.documents();
  sum.train_tokens = train.tokens();
  sum.val_documents = val ? val->documents() : 0;
  sum.val_tokens = val ? val->tokens() : 0;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.Finish(double(sum.bytes_read), Counts(sum));
  return sum;
}

}  // namespace keel::data
