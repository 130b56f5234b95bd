// `keel data prepare|inspect|verify`: build token datasets from text, look inside them, and check
// their integrity. The work is in keel/data; this file maps flags to options and prints results.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/data/assets.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/prepare.h"
#include "keel/data/tokenizer.h"
#include "keel/data/verify.h"

namespace keel::cli {
namespace {

std::string Mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / 1e6);
  return buf;
}

// Shows text with control characters escaped, so one sample stays readable on a terminal.
std::string Printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (uint8_t(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", uint8_t(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void PrintSummary(const data::PrepareOptions& o, const data::PrepareSummary& s) {
  std::printf("prepared %s: %" PRIu64 " files, %s, %" PRIu64 " documents in %.1f s (%.1f MB/s)\n",
              o.out.c_str(), s.files, Mb(s.bytes_read).c_str(), s.documents_read, s.seconds,
              s.seconds > 0 ? double(s.bytes_read) / 1e6 / s.seconds : 0.0);
  std::printf("  train: %" PRIu64 " documents, %" PRIu64 " tokens\n", s.train_documents,
              s.train_tokens);
  if (o.val_fraction > 0) {
    std::printf("  val:   %" PRIu64 " documents, %" PRIu64 " tokens\n", s.val_documents,
                s.val_tokens);
  }
  std::printf("  dropped: %" PRIu64 " shorter than %" PRIu64 " chars, %" PRIu64 " duplicates%s\n",
              s.dropped_short, o.min_chars, s.dropped_duplicate, o.dedup ? "" : " (dedup off)");
  if (o.format != "text") {
    std::printf("  trained on: %" PRIu64 " of %" PRIu64 " tokens (%.1f%%; the loss mask's)\n",
                s.trained_tokens, s.train_tokens + s.val_tokens,
                100.0 * double(s.trained_tokens) /
                    double(std::max<uint64_t>(1, s.train_tokens + s.val_tokens)));
  }
  if (s.skipped_lines > 0) {
    std::printf("  skipped: %" PRIu64 " bad JSONL lines (--on-error skip); the first: %s\n",
                s.skipped_lines, s.first_skipped.c_str());
  }
}

void Inspect(const std::string& path) {
  data::TokenDataset ds = data::TokenDataset::Open(path);
  if (ds.meta()) {
    const data::DatasetMeta& m = *ds.meta();
    std::printf("%s: %s v%d, tokenizer %s, vocab %d, eos %d, %s tokens\n", path.c_str(),
                data::kDatasetFormat, data::kDatasetVersion, m.tokenizer.c_str(), m.vocab_size,
                m.eos_id, m.dtype.c_str());
    std::printf("  %" PRIu64 " tokens, %" PRIu64 " documents (%.1f tokens each), %zu shards, %s\n",
                m.tokens(), m.documents(),
                m.documents() ? double(m.tokens()) / double(m.documents()) : 0.0, m.shards.size(),
                Mb(m.tokens() * m.token_bytes()).c_str());
    if (m.prepare) {
      std::printf("  prepared with nfc %s, on-error %s: %" PRIu64 " bad lines skipped, %" PRIu64
                  " short and %" PRIu64 " duplicate documents dropped (train and val)\n",
                  m.prepare->nfc ? "on" : "off", m.prepare->on_error.c_str(),
                  m.prepare->skipped_lines, m.prepare->dropped_short, m.prepare->dropped_duplicate);
      if (m.prepare->format != "text")
        std::printf("  format %s, chat template %s\n", m.prepare->format.c_str(),
                    m.prepare->chat_template.c_str());
    }
    if (m.masked()) {
      std::vector<uint8_t> flags(ds.size());
      ds.ReadMask(0, flags.size(), flags.data());
      uint64_t trained = 0;
      for (uint8_t f : flags) trained += f;
      std::printf("  loss mask: %" PRIu64 " of %" PRIu64 " tokens trained on (%.1f%%)\n", trained,
                  m.tokens(), m.tokens() ? 100.0 * double(trained) / double(m.tokens()) : 0.0);
    }
    for (const auto& s : m.shards) {
      std::printf("  %s  %12" PRIu64 " tokens  %9" PRIu64 " documents  xxh3 %s\n", s.file.c_str(),
                  s.tokens, s.documents, s.xxh3.c_str());
    }
  } else {
    std::printf("%s: flat uint16 token file, %zu tokens, %s (vocab %d, eos %d assumed)\n",
                path.c_str(), ds.size(), Mb(ds.size() * 2).c_str(), ds.vocab_size(), ds.eos_id());
  }
  // A decoded sample: the start of the first document.
  const size_t n = std::min<size_t>(ds.size(), 80);
  if (n == 0) return;
  std::vector<int32_t> ids(n);
  ds.Read(0, n, ids.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == ds.eos_id()) {
      ids.resize(i + 1);
      break;
    }
  }
  // The tokenizer meta.json names ("hf:PATH" for a tokenizer.json), else GPT-2's; none when its
  // vocabulary files are not here (scripts/fetch_tokenizers.sh makes cl100k's, o200k's, Llama 3's).
  std::optional<data::Tokenizer> loaded;
  try {
    loaded.emplace(data::Tokenizer::Load(data::TokenizerSpec(ds.meta()), data::AssetsDir()));
  } catch (const Error& e) {
    std::printf("sample: not decoded (%s)\n", e.what());
  }
  if (loaded && ds.vocab_size() == loaded->vocab_size()) {
    const data::Tokenizer& tok = *loaded;
    // Decoded in runs of valid ids; an id past the vocabulary shows as itself, out of range.
    std::string text;
    std::vector<int32_t> run;
    for (size_t i = 0; i <= ids.size(); ++i) {
      const bool bad = i < ids.size() && (ids[i] < 0 || ids[i] >= tok.vocab_size());
      if (i == ids.size() || bad) {
        text += tok.Decode(run);
        run.clear();
        if (bad) text += "<id " + std::to_string(ids[i]) + ": out of range>";
      } else {
        run.push_back(ids[i]);
      }
    }
    std::printf("sample (first %zu tokens, decoded with %s):\n  %s\n", ids.size(),
                tok.name().c_str(), Printable(text).c_str());
  }
  // A flat file has no meta.json that was checked when written: scan it all (a mapped read, about
  // a second per GB) and name the first id past the vocabulary (exit 2), as a run would.
  if (!ds.meta()) ds.CheckIds(ds.vocab_size());
}

}  // namespace

void RegisterData(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Build, inspect and verify token datasets");
  data->require_subcommand(1);
  data->footer(
      "Examples:\n"
      "  keel data prepare corpus.jsonl --out data/corpus --workers 8\n"
      "  keel data inspect data/corpus/train\n"
      "  keel data verify data/corpus/train");

  auto opts = std::make_shared<data::PrepareOptions>();
  opts->workers = int(std::max(1u, std::thread::hardware_concurrency()));
  auto* prepare = data->add_subcommand(
      "prepare", "Tokenize text (JSONL, .txt, folders) into OUT/train and OUT/val datasets");
  prepare
      ->add_option("inputs", opts->inputs,
                   "JSONL or text files (also .gz, .zst), or folders of them")
      ->required();
  prepare->add_option("--out", opts->out, "output folder; gets train/ and val/")->required();
  prepare->add_option("--field", opts->field, "JSONL field that holds the text")
      ->capture_default_str();
  prepare
      ->add_option("--val-fraction", opts->val_fraction,
                   "fraction of documents for val/ (0: no val/)")
      ->capture_default_str();
  prepare->add_option("--seed", opts->seed, "seed of the train/val split")->capture_default_str();
  prepare->add_option("--min-chars", opts->min_chars, "drop documents shorter than this")
      ->capture_default_str();
  prepare->add_flag("--dedup", opts->dedup, "drop exact duplicate documents (keeps the first)");
  prepare
      ->add_option("--tokenizer", opts->tokenizer,
                   "gpt2, cl100k, o200k, llama3 (scripts/fetch_tokenizers.sh makes the last "
                   "three), or a Hugging Face tokenizer.json or its folder")
      ->capture_default_str();
  prepare
      ->add_option("--workers", opts->workers,
                   "tokenizer threads (the output is the same for any number)")
      ->capture_default_str();
  prepare->add_option("--shard-tokens", opts->shard_tokens, "tokens per shard file")
      ->capture_default_str();
  prepare
      ->add_option("--format", opts->format,
                   "text: every token trained on; chat ({\"messages\": [{\"role\", "
                   "\"content\"}]}, or ShareGPT's conversations/from/value) or prompt-completion "
                   "({\"prompt\", \"completion\"}): JSONL "
                   "written with a loss mask, so only the assistant's or completion's tokens "
                   "are trained on")
      ->check(CLI::IsMember({"text", "chat", "prompt-completion"}))
      ->capture_default_str();
  prepare
      ->add_option("--chat-template", opts->chat_template,
                   "auto (llama3 for a tokenizer with Llama 3's header tokens, else plain), "
                   "plain (\"User: ...\\nAssistant: ...\\n\") or llama3")
      ->check(CLI::IsMember({"auto", "plain", "llama3"}))
      ->capture_default_str();
  prepare->add_flag("--nfc", opts->nfc,
                    "Unicode NFC-normalize each document first (off: text is tokenized as it is)");
  auto on_error = std::make_shared<std::string>("stop");
  prepare
      ->add_option("--on-error", *on_error,
                   "a JSONL line that is not an object with a string --field: stop (exit 2, "
                   "naming FILE:LINE) or skip (count it in the summary and meta.json)")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  prepare->footer(
      "Each document is followed by the vocabulary's end of text (GPT-2: <|endoftext|>, 50256; "
      "Llama 3: <|end_of_text|>, 128001). A .jsonl file holds one document per line; any other "
      "file is one document. Vocabularies past 65,536 ids are stored as uint32.\n"
      "Examples:\n"
      "  keel data prepare shared/data/brown/brown.jsonl --out data/brown --val-fraction 0.05\n"
      "  keel data prepare corpus.jsonl --out data/llama3 --tokenizer llama3\n"
      "  keel data prepare chats.jsonl --out data/chat --format chat --tokenizer llama3");
  prepare->callback([opts, on_error] {
    opts->on_error =
        *on_error == "skip" ? data::PrepareOnError::kSkip : data::PrepareOnError::kStop;
    opts->tokenizer_dir = data::TokenizerDir();
    opts->assets = data::AssetsDir();
    data::PrepareSummary s = data::Prepare(*opts);
    PrintSummary(*opts, s);
  });

  auto inspect_path = std::make_shared<std::string>();
  auto* inspect = data->add_subcommand(
      "inspect", "Show a dataset's counts, sizes and shards, and a decoded sample");
  inspect
      ->add_option("path", *inspect_path, "dataset folder, its http(s) URL, or a flat uint16 file")
      ->required();
  inspect->footer("Example:\n  keel data inspect data/brown/train");
  inspect->callback([inspect_path] { Inspect(*inspect_path); });

  auto verify_path = std::make_shared<std::string>();
  auto* verify = data->add_subcommand(
      "verify", "Check every shard's xxh3, document index and token ids; exit 2 on a problem");
  verify->add_option("path", *verify_path, "dataset folder, its http(s) URL, or a flat uint16 file")
      ->required();
  verify->footer("Example:\n  keel data verify data/brown/train");
  verify->callback([verify_path] {
    data::VerifySummary s = data::VerifyDataset(*verify_path);
    std::printf("ok: %s: %" PRIu64 " shards, %" PRIu64 " tokens, %" PRIu64
                " documents; hashes, index and ids check out\n",
                verify_path->c_str(), s.shards, s.tokens, s.documents);
  });
}

}  // namespace keel::cli
