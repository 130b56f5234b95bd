// Reading checkpoints against the manifest's global description: a reader asks for a box of a
// tensor and gets it from whichever pieces overlap it, so a state written by N ranks loads on M
// (and, when sharded layouts arrive, into their slices). Every piece read is checked against its
// xxh3 before its bytes are used.
//
//   CheckpointReader r = CheckpointReader::Open("runs/x/checkpoints/step_00000020");
//   r.Load(view.tensors, view.buffers);       // whole tensors, every kind in `buffers`
//   VerifyResult v = Verify("runs/x/checkpoints/step_00000020");   // never throws
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "keel/ckpt/manifest.h"
#include "keel/ckpt/state.h"
#include "keel/core/memory.h"

namespace keel::ckpt {

class CheckpointReader {
 public:
  // Trusts a folder only with a COMMIT that holds the hash of its manifest.json. Throws
  // keel::Error (bad input) with one line naming the file and what is wrong.
  static CheckpointReader Open(const std::string& dir);
  // Reads `bytes` at `offset` of the checkpoint's `file` (a piece's) into `dst`; throws naming
  // what it could not read.
  using ReadFn =
      std::function<void(const std::string& file, uint64_t offset, uint64_t bytes, void* dst)>;
  // A checkpoint whose files are not in a folder (a tier-0 copy in holders' memory): `name` stands
  // for the folder in messages. Every piece is verified as from a folder.
  static CheckpointReader FromSource(std::string name, Manifest m, ReadFn read);

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }

  // Reads the box [start, start + count) of `t` into `out` (row-major over the box), verifying
  // every piece it touches. Throws bad input naming the file, tensor and piece on a mismatch.
  void ReadBox(const TensorEntry& t, const std::vector<int64_t>& start,
               const std::vector<int64_t>& count, float* out) const;
  // Reads every tensor of `tensors`, for every kind in `buffers`: whole, or (hi > 0) only the flat
  // range [lo, hi) of the layout, into buffers whose element 0 is flat index lo (a ZeRO shard).
  // A tensor missing from the checkpoint or with another shape is bad input naming it and both
  // shapes. `progress`: a progress line on stderr while it reads (core/progress.h). The buffers
  // live in `mem` (a GPU's: each box goes through host memory).
  void Load(const std::vector<TensorSpec>& tensors, const std::vector<FlatBuffer>& buffers,
            size_t lo = 0, size_t hi = 0, bool progress = false,
            const Memory& mem = HostMemory()) const;

  // Reads each of `own` that the checkpoint holds under its name and size, or else under a name its
  // stand_in matches (verified as above), and returns the names of the others, which it zeroes
  // unless they keep_if_missing (a run whose layout changed starts its own state afresh).
  std::vector<std::string> LoadOwn(const std::vector<OwnBuffer>& own) const;

 private:
  std::string dir_;
  Manifest manifest_;
  ReadFn read_;
};

struct BadPiece {
  std::string tensor, kind, file;
  uint64_t offset = 0, bytes = 0;
  std::string problem;  // "missing file", "short file", "xxh3 mismatch"
};

struct VerifyResult {
  std::string dir;
  int64_t step = -1;
  uint64_t tokens = 0, bytes = 0;
  size_t tensors = 0, pieces = 0;
  std::string status;   // "committed" | "incomplete" | "corrupt"
  std::string problem;  // the first problem, one line; empty when committed
  std::vector<BadPiece> bad;
};

// Checks COMMIT, the manifest and every piece's hash. Reports instead of throwing. `progress`:
// a progress line on stderr while it reads.
VerifyResult Verify(const std::string& dir, bool progress = false);

}  // namespace keel::ckpt
