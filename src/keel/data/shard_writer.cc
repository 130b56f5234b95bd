// ShardWriter: streams tokens into shard files with a running XXH3; see shard_writer.h.
#include "keel/data/shard_writer.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/hex.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

std::string ShardName(size_t index, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard_%05zu.%s", index, ext);
  return buf;
}

// One output file written under NAME.tmp and renamed to NAME by Commit(); removed if destroyed
// uncommitted. Hashes what it writes.
class TmpFile {
 public:
  explicit TmpFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (!file_) ThrowRuntime(tmp_ + ": cannot create: " + std::strerror(errno));
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
    XXH3_64bits_reset(hash_.get());
  }
  TmpFile(const TmpFile&) = delete;
  TmpFile& operator=(const TmpFile&) = delete;
  ~TmpFile() {
    if (file_) {
      std::fclose(file_);
      std::remove(tmp_.c_str());
    }
  }

  void Write(const void* data, size_t bytes) {
    if (bytes == 0) return;
    if (std::fwrite(data, 1, bytes, file_) != bytes) {
      ThrowRuntime(tmp_ + ": cannot write: " + std::strerror(errno));
    }
    XXH3_64bits_update(hash_.get(), data, bytes);
  }

  // Flushes, fsyncs and renames into place; returns the XXH3 of the bytes written.
  uint64_t Commit() {
    if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0) {
      ThrowRuntime(tmp_ + ": cannot flush: " + std::strerror(errno));
    }
    std::fclose(file_);
    file_ = nullptr;
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      ThrowRuntime(tmp_ + ": cannot rename: " + std::strerror(errno));
    }
    return XXH3_64bits_digest(hash_.get());
  }

 private:
  struct StateFree {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<XXH3_state_t, StateFree> hash_{XXH3_createState()};
};

}  // namespace

struct ShardWriter::Impl {
  std::string dir;
  ShardWriterOptions options;
  DatasetMeta meta;
  bool wide = false;  // uint32 tokens

  std::unique_ptr<TmpFile> bin;     // the shard in progress, if any
  std::unique_ptr<TmpFile> mask;    // its loss mask (masked writers)
  std::vector<uint64_t> doc_start;  // its document start offsets
  uint64_t shard_tokens = 0;        // tokens in it so far
  bool doc_open = false;            // tokens appended since the last EndDocument
  uint64_t done_tokens = 0, done_docs = 0;
  std::vector<uint8_t> buf;  // conversion buffer
  bool finished = false;

  void OpenShard() {
    bin = std::make_unique<TmpFile>(dir + "/" + ShardName(meta.shards.size(), "bin"));
    if (options.masked)
      mask = std::make_unique<TmpFile>(dir + "/" + ShardName(meta.shards.size(), "mask"));
    doc_start.clear();
    shard_tokens = 0;
  }

  void CloseShard() {
    ShardMeta s;
    s.file = ShardName(meta.shards.size(), "bin");
    s.index = ShardName(meta.shards.size(), "idx");
    s.tokens = shard_tokens;
    s.documents = doc_start.size();
    TmpFile idx(dir + "/" + s.index);
    // Little-endian on disk; keel only targets little-endian hosts (x86-64, aarch64).
    idx.Write(doc_start.data(), doc_start.size() * sizeof(uint64_t));
    idx.Write(&shard_tokens, sizeof shard_tokens);
    s.index_xxh3 = HashHex(idx.Commit());
    s.xxh3 = HashHex(bin->Commit());
    bin.reset();
    if (mask) {
      s.mask = ShardName(meta.shards.size(), "mask");
      s.mask_xxh3 = HashHex(mask->Commit());
      mask.reset();
    }
    meta.shards.push_back(std::move(s));
  }
};

ShardWriter::ShardWriter(std::string dir, ShardWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = std::move(dir);
  m.options = std::move(options);
  if (m.options.vocab_size <= 0 || m.options.eos_id < 0 || m.options.eos_id >= m.options.vocab_size)
    ThrowBadInput(m.dir + ": expected 0 <= eos_id < vocab_size");
  m.meta.tokenizer = m.options.tokenizer;
  m.meta.vocab_size = m.options.vocab_size;
  m.meta.eos_id = m.options.eos_id;
  m.wide = m.options.vocab_size > 65536;
  m.meta.dtype = m.wide ? "uint32" : "uint16";
  std::error_code ec;
  fs::create_directories(m.dir, ec);
  if (ec) ThrowRuntime(m.dir + ": cannot create folder: " + ec.message());
  // meta.json goes first: from here on the folder is not a dataset until Finish().
  fs::remove(m.dir + "/meta.json", ec);
  if (ec) ThrowRuntime(m.dir + "/meta.json: cannot remove: " + ec.message());
  for (const auto& entry : fs::directory_iterator(m.dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("shard_") || name == "meta.json.tmp") fs::remove(entry.path(), ec);
  }
  SyncDir(m.dir);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::Append(std::span<const int32_t> tokens, std::span<const uint8_t> mask) {
  Impl& m = *impl_;
  KEEL_CHECK(!m.finished, "ShardWriter::Append after Finish");
  KEEL_CHECK(!m.options.masked || mask.size() == tokens.size(),
             "ShardWriter::Append: a masked writer needs one flag per token");
  if (!m.bin) m.OpenShard();
  if (!m.doc_open) {
    m.doc_start.push_back(m.shard_tokens);
    m.doc_open = true;
  }
  const size_t width = m.wide ? 4 : 2;
  m.buf.resize(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (t < 0 || t >= m.options.vocab_size) {
      ThrowBadInput(m.dir + ": token id " + std::to_string(t) + " at document " +
                    std::to_string(m.done_docs) + ": expected an id in [0, " +
                    std::to_string(m.options.vocab_size) + ")");
    }
    if (m.wide) {
      auto v = uint32_t(t);
      std::memcpy(&m.buf[i * 4], &v, 4);
    } else {
      auto v = uint16_t(t);
      std::memcpy(&m.buf[i * 2], &v, 2);
    }
  }
  m.bin->Write(m.buf.data(), m.buf.size());
  if (m.mask) m.mask->Write(mask.data(), mask.size());
  m.shard_tokens += tokens.size();
  m.done_tokens += tokens.size();
}

void ShardWriter::EndDocument() {
  Impl& m = *impl_;
  if (!m.doc_open) Append({});  // an empty document still gets an index entry
  m.doc_open = false;
  ++m.done_docs;
  if (m.shard_tokens >= m.options.shard_tokens) m.CloseShard();
}

DatasetMeta ShardWriter::Finish(std::optional<PrepareRecord> record) {
  Impl& m = *impl_;
  m.meta.prepare = std::move(record);
  KEEL_CHECK(!m.finished, "ShardWriter::Finish called twice");
  if (m.doc_open) EndDocument();
  if (m.bin) m.CloseShard();
  m.finished = true;
  SyncDir(m.dir);  // the shard renames are durable before meta.json points at them
  WriteFileAtomic(m.dir + "/meta.json", DatasetMetaToJson(m.meta));
  return m.meta;
}

uint64_t ShardWriter::tokens() const { return impl_->done_tokens; }
uint64_t ShardWriter::documents() const { return impl_->done_docs; }

}  // namespace keel::data
