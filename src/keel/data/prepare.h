// `keel data prepare`: turns text (JSONL, .txt, folders of them) into keel-tokens datasets
// OUT/train and OUT/val, each document followed by the eos token.
//
//   keel::data::PrepareOptions o;
//   o.inputs = {"corpus/"};
//   o.out = "data/corpus";
//   o.tokenizer_dir = "assets/gpt2";
//   keel::data::PrepareSummary s = keel::data::Prepare(o);
//
// Output is a function of the inputs and options only: any number of workers gives the same bytes.
// Memory is bounded by the documents in flight (a few per worker), not by the corpus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keel::data {

// What prepare does with a JSONL line that is not JSON, not an object, or lacks a string `field`.
enum class PrepareOnError {
  kStop,  // fail naming FILE:LINE; no meta.json is written, so nothing looks complete
  kSkip,  // drop the line, count it (summary and meta.json) and go on
};

struct PrepareOptions {
  // Files or folders. A folder contributes its *.jsonl and *.txt files, recursively, in sorted
  // path order. A .jsonl file holds one document per line; any other file is one document.
  std::vector<std::string> inputs;
  std::string out;  // gets train/ and, when val_fraction > 0, val/
  // "gpt2" (from tokenizer_dir), or any other Tokenizer::Load spec: "cl100k", "o200k", "llama3"
  // (from assets/tokenizers) or a tokenizer.json. Ids of a vocabulary past 65,536 are uint32.
  std::string tokenizer = "gpt2";
  std::string tokenizer_dir;   // GPT-2's encoder.json and vocab.bpe
  std::string assets;          // the folder of gpt2/ and tokenizers/
  std::string field = "text";  // the JSONL field holding the document text
  // "text": documents of plain text, every token trained on. "chat" or "prompt-completion":
  // JSONL of conversations or pairs (chat_format.h), written with a loss mask so that only the
  // assistant's or completion's tokens are trained on.
  std::string format = "text";
  std::string chat_template = "auto";  // "auto", "plain" or "llama3" (chat_format.h)
  // Each document goes to val with this probability, decided by a hash of (seed, its index in
  // the input), so the split does not depend on filtering or on the number of workers.
  double val_fraction = 0.05;
  uint64_t seed = 1;
  uint64_t min_chars = 0;  // drop documents with fewer code points
  bool dedup = false;      // drop exact repeats (XXH3 of the text), keeping the first
  // Unicode NFC before filtering and tokenizing, so that "e\u0301" and "\u00e9" give the same
  // tokens. Off by default: the reference token files are of the text as it is. A document that
  // is not valid UTF-8 is left as it is (the tokenizer encodes its bytes).
  bool nfc = false;
  PrepareOnError on_error = PrepareOnError::kStop;
  int workers = 1;  // tokenizer threads
  uint64_t shard_tokens = uint64_t(1) << 27;
  bool progress = true;  // a progress line on stderr every two seconds
  // A non-JSONL file bigger than this is tokenized in pieces cut at line breaks where no
  // pre-token pattern (GPT-2's, cl100k's, o200k's) can join across the cut, so the ids are those
  // of the whole text. Exposed
  // for tests.
  uint64_t text_chunk_bytes = uint64_t(64) << 20;
};

struct PrepareSummary {
  uint64_t files = 0;
  uint64_t bytes_read = 0;
  uint64_t documents_read = 0;
  uint64_t train_documents = 0, train_tokens = 0;
  uint64_t val_documents = 0, val_tokens = 0;
  uint64_t dropped_short = 0;
  uint64_t dropped_duplicate = 0;
  uint64_t skipped_lines = 0;   // bad JSONL lines under PrepareOnError::kSkip
  uint64_t trained_tokens = 0;  // loss-masked formats: tokens the mask trains on, train and val
  std::string first_skipped;    // the first one's message, "FILE:LINE: expected ..."
  double seconds = 0;
};

// Throws keel::Error (bad input) naming the file and line for unreadable input, a JSONL line
// that is not an object with a string `field` (unless skipped), or no input files at all. On any
// error no meta.json is written, so a partial output is never mistaken for a dataset. Each
// meta.json written records the options and counts of the run under "prepare" (dataset_meta.h).
PrepareSummary Prepare(const PrepareOptions& options);

}  // namespace keel::data
