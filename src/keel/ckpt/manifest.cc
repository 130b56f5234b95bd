#include "keel/ckpt/manifest.h"

#include <xxhash.h>
#if defined(__x86_64__)
#include <immintrin.h>
#include <xxh_x86dispatch.h>  // after xxhash.h: the XXH3 names become the dispatching ones
#endif

#include <new>

#include "keel/core/error.h"

namespace keel::ckpt {

using nlohmann::json;

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

const TensorEntry* Manifest::Find(const std::string& name, const std::string& kind) const {
  for (const auto& t : tensors)
    if (t.name == name && t.kind == kind) return &t;
  return nullptr;
}

uint64_t Manifest::TotalBytes() const {
  uint64_t b = 0;
  for (const auto& t : tensors)
    for (const auto& p : t.pieces) b += p.bytes;
  return b;
}

namespace {

// Checkpoints hash every byte they save, send and load, so the hashes go through libxxhash's
// run-time dispatch (xxh_x86dispatch.h maps the XXH3 names onto entry points that pick AVX2 or
// AVX-512; the plain ones run Debian's baseline SSE2 build): 1.6-1.8x the speed (an AVX-512 Xeon:
// 16 -> 26 GB/s in cache, 5.7 -> 10.5 from memory). But Debian's 0.8.1 returns from its AVX-512
// one-shot hash with the upper halves of the vector registers dirty (XINUSE bits 2 and 6), and
// every legacy-SSE instruction after that pays a transition penalty: keel's x86-64-v2 code (the
// weights' initialisation, libm) ran 37x slower in the thread that hashed and in threads started
// from it, the quickstart's start 2 s longer. So each call ends with VZEROUPPER where the CPU has
// AVX (tests/ckpt: ckpt_test HashStream.*).
#if defined(__x86_64__)
__attribute__((target("avx"))) void ZeroUpper() { _mm256_zeroupper(); }
#endif

void CleanUpperState() {
#if defined(__x86_64__)
  static const bool avx = __builtin_cpu_supports("avx");
  if (avx) ZeroUpper();
#endif
}

}  // namespace

uint64_t Hash(const void* data, size_t bytes) {
  const uint64_t h = XXH3_64bits(data, bytes);
  CleanUpperState();
  return h;
}

HashStream::HashStream(uint64_t seed) : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state_), seed);
}
HashStream::~HashStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void HashStream::Update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
  CleanUpperState();
}
uint64_t HashStream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

uint64_t PieceHash(const void* data, size_t bytes, const std::string& name, const std::string& kind,
                   const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                   int version) {
  if (version < 2) return Hash(data, bytes);
  const uint64_t h = XXH3_64bits_withSeed(data, bytes, PieceSeed(name, kind, start, count));
  CleanUpperState();
  return h;
}

uint64_t PieceSeed(const std::string& name, const std::string& kind,
                   const std::vector<int64_t>& start, const std::vector<int64_t>& count) {
  std::string label = name + "|" + kind + "|";
  for (int64_t s : start) label += std::to_string(s) + ",";
  label += "|";
  for (int64_t c : count) label += std::to_string(c) + ",";
  return Hash(label.data(), label.size());
}

uint64_t ParseHexHash(const std::string& s, const std::string& where) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    ThrowBadInput(where + ": expected 16 lowercase hex digits, got \"" + s + "\"");
  return std::stoull(s, nullptr, 16);
}

std::string ToJsonText(const Manifest& m) {
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json pieces = json::array();
    for (const auto& p : t.pieces)
      pieces.push_back({{"file", p.file},
                        {"offset", p.offset},
                        {"bytes", p.bytes},
                        {"start", p.start},
                        {"count", p.count},
                        {"xxh3", HashHex(p.xxh3)}});
    tensors.push_back({{"name", t.name},
                       {"kind", t.kind},
                       {"dtype", t.dtype},
                       {"shape", t.shape},
                       {"pieces", pieces}});
  }
  json j = {{"format", kFormat},  {"version", m.version}, {"step", m.step},
            {"tokens", m.tokens}, {"state", m.state},     {"tensors", tensors}};
  return j.dump(1) + "\n";
}

namespace {

// Typed access that names the key path in its error.
const json& Key(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) ThrowBadInput(where + ": missing key \"" + key + "\"");
  return j.at(key);
}

template <typename T>
T Get(const json& j, const std::string& key, const std::string& where) {
  const json& v = Key(j, key, where);
  const std::string at = where + ": " + key;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) ThrowBadInput(at + ": expected a string, got " + v.dump());
  } else if constexpr (std::is_unsigned_v<T>) {
    if (!v.is_number_unsigned())
      ThrowBadInput(at + ": expected an unsigned integer, got " + v.dump());
  } else {
    if (!v.is_number_integer()) ThrowBadInput(at + ": expected an integer, got " + v.dump());
  }
  return v.get<T>();
}

std::vector<int64_t> Dims(const json& j, const std::string& key, const std::string& where) {
  const json& v = Key(j, key, where);
  std::vector<int64_t> out;
  if (!v.is_array()) ThrowBadInput(where + ": " + key + ": expected an array of integers");
  for (const json& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      ThrowBadInput(where + ": " + key + ": expected non-negative integers, got " + v.dump());
    out.push_back(d.get<int64_t>());
  }
  return out;
}

void CheckPiece(const TensorEntry& t, const Piece& p, const std::string& where) {
  if (p.start.size() != t.shape.size() || p.count.size() != t.shape.size())
    ThrowBadInput(where + ": start/count have " + std::to_string(p.start.size()) + "/" +
                  std::to_string(p.count.size()) + " axes, the tensor has " +
                  std::to_string(t.shape.size()));
  uint64_t n = 1;
  for (size_t a = 0; a < t.shape.size(); ++a) {
    if (p.start[a] + p.count[a] > t.shape[a])
      ThrowBadInput(where + ": axis " + std::to_string(a) + " range [" +
                    std::to_string(p.start[a]) + ", " + std::to_string(p.start[a] + p.count[a]) +
                    ") is outside the shape (" + std::to_string(t.shape[a]) + ")");
    n *= uint64_t(p.count[a]);
  }
  if (p.bytes != n * 4)
    ThrowBadInput(where + ": bytes " + std::to_string(p.bytes) + " does not match the box (" +
                  std::to_string(n) + " f32 = " + std::to_string(n * 4) + " bytes)");
  // A file of this checkpoint, or of an older one in the same folder ("../step_N/FILE"): an
  // unchanged piece referenced rather than rewritten. Nothing else, so no manifest can make a
  // reader open files outside the checkpoints folder.
  std::string name = p.file;
  if (name.rfind("../step_", 0) == 0) {
    const size_t slash = name.find('/', 3);
    const std::string dir = slash == std::string::npos ? "" : name.substr(3, slash - 3);
    const bool ok = dir.size() >= 13 && dir.find_first_not_of("0123456789", 5) == std::string::npos;
    name = ok ? name.substr(slash + 1) : "";
  }
  if (name.empty() || name.find('/') != std::string::npos || name == ".." || name == ".")
    ThrowBadInput(where + ": file: expected a file name inside the checkpoint, got \"" + p.file +
                  "\"");
}

}  // namespace

Manifest ManifestFromJsonText(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    ThrowBadInput(where + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) ThrowBadInput(where + ": expected a JSON object");
  const std::string format = Get<std::string>(j, "format", where);
  if (format != kFormat)
    ThrowBadInput(where + ": format: expected \"" + std::string(kFormat) + "\", got \"" + format +
                  "\"");
  const int version = Get<int>(j, "version", where);
  if (version < 1 || version > kVersion)
    ThrowBadInput(where + ": version: this keel reads versions 1 to " + std::to_string(kVersion) +
                  ", got " + std::to_string(version));
  Manifest m;
  m.version = version;
  m.step = Get<int64_t>(j, "step", where);
  m.tokens = Get<uint64_t>(j, "tokens", where);
  m.state = Key(j, "state", where);
  if (!m.state.is_object()) ThrowBadInput(where + ": state: expected an object");
  const json& tensors = Key(j, "tensors", where);
  if (!tensors.is_array()) ThrowBadInput(where + ": tensors: expected an array");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string tw = where + ": tensors[" + std::to_string(i) + "]";
    const json& jt = tensors[i];
    TensorEntry t;
    t.name = Get<std::string>(jt, "name", tw);
    t.kind = Get<std::string>(jt, "kind", tw);
    t.dtype = Get<std::string>(jt, "dtype", tw);
    if (t.dtype != "f32")
      ThrowBadInput(tw + " (" + t.name + "): dtype: expected f32, got " + t.dtype);
    t.shape = Dims(jt, "shape", tw);
    const json& pieces = Key(jt, "pieces", tw);
    if (!pieces.is_array()) ThrowBadInput(tw + ": pieces: expected an array");
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string pw =
          tw + " (" + t.name + " " + t.kind + "): pieces[" + std::to_string(k) + "]";
      const json& jp = pieces[k];
      Piece p;
      p.file = Get<std::string>(jp, "file", pw);
      p.offset = Get<uint64_t>(jp, "offset", pw);
      p.bytes = Get<uint64_t>(jp, "bytes", pw);
      p.start = Dims(jp, "start", pw);
      p.count = Dims(jp, "count", pw);
      p.xxh3 = ParseHexHash(Get<std::string>(jp, "xxh3", pw), pw + ": xxh3");
      CheckPiece(t, p, pw);
      t.pieces.push_back(std::move(p));
    }
    m.tensors.push_back(std::move(t));
  }
  return m;
}

}  // namespace keel::ckpt
