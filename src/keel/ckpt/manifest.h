// The checkpoint manifest: a global description of every tensor of the training state, made of
// pieces (a file, a byte range, a box of indices along each axis, an xxh3), plus the non-tensor
// state (step, tokens, loader, scheduler, RNG, ...). A reader under any layout computes the box
// it needs and reads the pieces that overlap it; it never needs to know how many ranks wrote.
//
//   Manifest m = ReadManifest("runs/x/checkpoints/step_00000020");   // checks COMMIT first
//   const TensorEntry& t = m.Find("h.0.attn.c_attn.weight", "master");
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/core/hex.h"
#include "keel/data/dataset_meta.h"

namespace keel::ckpt {

inline constexpr const char* kFormat = "keel-checkpoint";
// Version 2: a piece's xxh3 is seeded by what it claims to be (PieceHash), so that a manifest
// whose pieces were swapped between tensors, kinds or boxes is refused. Version 1 (a plain xxh3
// of the bytes) is still read.
inline constexpr int kVersion = 2;

// A rectangular piece of a tensor stored contiguously (row-major) in `file` at `offset`.
struct Piece {
  std::string file;  // relative to the checkpoint folder
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> start;  // first index along each axis
  std::vector<int64_t> count;  // extent along each axis
  uint64_t xxh3 = 0;

  bool operator==(const Piece&) const = default;
};

// The kind of a tensor that one rank alone holds and loads (StateView::own): a flat run of fp32
// under a name that says whose it is, not a model tensor, never resharded.
inline constexpr const char* kOwnKind = "own";

struct TensorEntry {
  std::string name;            // the parameter registry's name, e.g. "h.0.mlp.c_fc.weight"
  std::string kind;            // "master" | "adam_m" | "adam_v" | kOwnKind
  std::string dtype = "f32";   // the only one written so far
  std::vector<int64_t> shape;  // global shape
  std::vector<Piece> pieces;

  uint64_t numel() const;
  bool operator==(const TensorEntry&) const = default;
};

struct Manifest {
  int version = kVersion;
  int64_t step = 0;     // optimizer steps done
  uint64_t tokens = 0;  // training tokens consumed
  // Everything that is not a tensor: "config" (TOML text), "layout" ({"dp": N}), "loader",
  // "scheduler", "optimizer", "rng", "loss_scaler", "metrics". Written and read as JSON.
  nlohmann::json state = nlohmann::json::object();
  std::vector<TensorEntry> tensors;

  const TensorEntry* Find(const std::string& name, const std::string& kind) const;
  uint64_t TotalBytes() const;
};

std::string ToJsonText(const Manifest& m);
// Throws keel::Error (bad input) "WHERE: KEY: expected ..., got ..." for a malformed manifest,
// a wrong format or version, a piece outside its tensor or with a size that does not match.
Manifest ManifestFromJsonText(const std::string& text, const std::string& where);

// An xxh3 as 16 lowercase hex digits (HashHex, core/hex.h, as meta.json writes them), and back
// (throws bad input naming `where` if not hex).
using keel::HashHex;
uint64_t ParseHexHash(const std::string& s, const std::string& where);
uint64_t Hash(const void* data, size_t bytes);  // xxh3-64
// xxh3-64 a slice at a time (Hash, or PieceHash with PieceSeed's seed, of the slices end to end):
// a transfer hashes each slice while it is in cache.
class HashStream {
 public:
  explicit HashStream(uint64_t seed = 0);
  ~HashStream();
  HashStream(HashStream&& o) noexcept : state_(o.state_) { o.state_ = nullptr; }
  HashStream(const HashStream&) = delete;
  HashStream& operator=(const HashStream&) = delete;
  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t
};
// A piece's hash as manifest `version` defines it: from version 2, the xxh3 of its bytes seeded
// with the xxh3 of "NAME|KIND|START|COUNT", binding the bytes to the tensor, kind and box.
uint64_t PieceHash(const void* data, size_t bytes, const std::string& name, const std::string& kind,
                   const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                   int version = kVersion);
// Version 2's seed of a piece's hash: the xxh3 of "NAME|KIND|START|COUNT" (for a piece hashed as
// it streams: XXH3_64bits_reset_withSeed with this gives PieceHash).
uint64_t PieceSeed(const std::string& name, const std::string& kind,
                   const std::vector<int64_t>& start, const std::vector<int64_t>& count);

}  // namespace keel::ckpt
