#include "keel/ckpt/reader.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "keel/ckpt/checkpoint_model.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/progress.h"

namespace keel::ckpt {
namespace fs = std::filesystem;

namespace {

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Reads `bytes` at `offset` of `path` into `dst`; the error names the file and the shortfall.
void ReadAt(const std::string& path, uint64_t offset, uint64_t bytes, void* dst) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowBadInput(path + ": missing or unreadable: " + std::strerror(errno));
  uint64_t done = 0;
  while (done < bytes) {
    ssize_t r = ::pread(fd, static_cast<char*>(dst) + done, bytes - done, off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      ThrowBadInput(path + ": short file: expected " + std::to_string(bytes) + " bytes at offset " +
                    std::to_string(offset) + ", got " + std::to_string(done));
    }
    done += uint64_t(r);
  }
  ::close(fd);
}

// Copies the intersection of piece box (ps, pc) and request box (bs, bc) from `src` (the piece,
// row-major) to `dst` (the request, row-major), one contiguous run of the last axis at a time.
void CopyIntersection(const float* src, const std::vector<int64_t>& ps,
                      const std::vector<int64_t>& pc, float* dst, const std::vector<int64_t>& bs,
                      const std::vector<int64_t>& bc) {
  const size_t d = ps.size();
  std::vector<int64_t> lo(d), hi(d);
  for (size_t a = 0; a < d; ++a) {
    lo[a] = std::max(ps[a], bs[a]);
    hi[a] = std::min(ps[a] + pc[a], bs[a] + bc[a]);
    if (hi[a] <= lo[a]) return;
  }
  if (d == 0) {
    dst[0] = src[0];
    return;
  }
  std::vector<int64_t> pstride(d, 1), bstride(d, 1);
  for (size_t a = d - 1; a > 0; --a) {
    pstride[a - 1] = pstride[a] * pc[a];
    bstride[a - 1] = bstride[a] * bc[a];
  }
  const int64_t run = hi[d - 1] - lo[d - 1];
  std::vector<int64_t> idx(lo);
  for (;;) {
    int64_t so = 0, o = 0;
    for (size_t a = 0; a < d; ++a) {
      so += (idx[a] - ps[a]) * pstride[a];
      o += (idx[a] - bs[a]) * bstride[a];
    }
    std::memcpy(dst + o, src + so, size_t(run) * sizeof(float));
    // Next index over axes 0..d-2 (the last axis is the run).
    size_t a = d - 1;
    while (a > 0) {
      --a;
      if (++idx[a] < hi[a]) break;
      idx[a] = lo[a];
      if (a == 0) return;
    }
    if (d == 1) return;
  }
}

}  // namespace

CheckpointReader CheckpointReader::Open(const std::string& dir) {
  CheckpointReader r;
  r.dir_ = dir;
  if (!fs::is_directory(dir)) ThrowBadInput(dir + ": not a checkpoint folder (missing)");
  std::string commit;
  {
    std::ifstream f(dir + "/COMMIT");
    if (!f)
      ThrowBadInput(dir + "/COMMIT: missing: the checkpoint was never committed (incomplete)");
    std::string word, hex;
    if (!(f >> word >> hex) || word != "xxh3")
      ThrowBadInput(dir + "/COMMIT: expected \"xxh3 <16 hex digits>\"");
    commit = hex;
  }
  const std::string text = ReadWholeFile(dir + "/manifest.json");
  const uint64_t want = ParseHexHash(commit, dir + "/COMMIT");
  const uint64_t got = Hash(text.data(), text.size());
  if (want != got)
    ThrowBadInput(dir + "/manifest.json: xxh3 " + HashHex(got) + " does not match COMMIT (" +
                  commit + "): the manifest was changed or corrupted");
  r.manifest_ = ManifestFromJsonText(text, dir + "/manifest.json");
  r.read_ = [dir](const std::string& file, uint64_t offset, uint64_t bytes, void* dst) {
    ReadAt(dir + "/" + file, offset, bytes, dst);
  };
  return r;
}

CheckpointReader CheckpointReader::FromSource(std::string name, Manifest m, ReadFn read) {
  CheckpointReader r;
  r.dir_ = std::move(name);
  r.manifest_ = std::move(m);
  r.read_ = std::move(read);
  return r;
}

void CheckpointReader::ReadBox(const TensorEntry& t, const std::vector<int64_t>& start,
                               const std::vector<int64_t>& count, float* out) const {
  KEEL_CHECK(start.size() == t.shape.size() && count.size() == t.shape.size(),
             "ReadBox: box rank differs from " + t.name);
  uint64_t want = 1, got = 0;
  for (int64_t c : count) want *= uint64_t(c);
  std::vector<float> tmp;
  for (const Piece& p : t.pieces) {
    bool overlaps = true;
    uint64_t overlap = 1;
    for (size_t a = 0; a < start.size(); ++a) {
      const int64_t lo = std::max(p.start[a], start[a]);
      const int64_t hi = std::min(p.start[a] + p.count[a], start[a] + count[a]);
      overlaps = overlaps && hi > lo;
      overlap *= overlaps ? uint64_t(hi - lo) : 0;
    }
    if (!overlaps) continue;
    const std::string path = dir_ + "/" + p.file;
    tmp.resize(p.bytes / 4);
    read_(p.file, p.offset, p.bytes, tmp.data());
    const uint64_t h =
        PieceHash(tmp.data(), p.bytes, t.name, t.kind, p.start, p.count, manifest_.version);
    if (h != p.xxh3)
      ThrowBadInput(path + ": " + t.name + " (" + t.kind + ") bytes [" + std::to_string(p.offset) +
                    ", " + std::to_string(p.offset + p.bytes) + "): xxh3 " + HashHex(h) +
                    ", the manifest says " + HashHex(p.xxh3) + " (corrupt)");
    CopyIntersection(tmp.data(), p.start, p.count, out, start, count);
    got += overlap;
  }
  if (got != want)
    ThrowBadInput(dir_ + "/manifest.json: " + t.name + " (" + t.kind + "): the pieces cover " +
                  std::to_string(got) + " of the " + std::to_string(want) +
                  " elements asked for (missing pieces)");
}

void CheckpointReader::Load(const std::vector<TensorSpec>& tensors,
                            const std::vector<FlatBuffer>& buffers, size_t lo, size_t hi,
                            bool progress, const Memory& mem) const {
  std::vector<float> host;
  std::vector<bf16> narrow;
  // Element `at` of buffer b. A bf16 buffer is read as fp32 and rounded to nearest (state.h).
  auto read = [&](const TensorEntry& t, const std::vector<int64_t>& start,
                  const std::vector<int64_t>& count, const FlatBuffer& b, size_t at, size_t n) {
    if (b.data && b.dtype == DType::kF32 && mem.host_visible())
      return ReadBox(t, start, count, static_cast<float*>(b.data) + at);
    host.resize(n);
    ReadBox(t, start, count, host.data());
    const void* out = host.data();
    if (b.dtype == DType::kBF16) {
      narrow.resize(n);
      ConvertF32ToBf16(narrow.data(), host.data(), n);
      out = narrow.data();
    }
    if (!b.data) return b.write(at, n, out);  // an offload tier's
    mem.FromHost(static_cast<char*>(b.data) + DTypeSize(b.dtype) * at, out, DTypeSize(b.dtype) * n);
  };
  double total = 0, done = 0;
  for (const TensorSpec& s : tensors) total += 4.0 * double(s.numel()) * double(buffers.size());
  if (hi > 0) total = 4.0 * double(hi - lo) * double(buffers.size());
  Progress bar("load " + dir_, total, "B", progress);
  for (const TensorSpec& s : tensors)
    for (const FlatBuffer& b : buffers) {
      bar.Update(done);
      const TensorEntry* t = manifest_.Find(s.name, b.kind);
      if (!t)
        ThrowBadInput(dir_ + "/manifest.json: no tensor " + s.name + " (" + b.kind +
                      "): the checkpoint is of another model");
      if (t->shape != s.shape)
        ThrowBadInput(dir_ + "/manifest.json: " + s.name + " (" + b.kind + ") has shape " +
                      Shape(t->shape) + ", the model config expects " + Shape(s.shape));
      if (hi == 0 && s.local_shape.empty()) {
        read(*t, std::vector<int64_t>(s.shape.size(), 0), s.shape, b, s.offset, s.numel());
        done += 4.0 * double(s.numel());
        continue;
      }
      // A shard: the boxes of this tensor that fall in [lo, hi), whatever pieces hold them.
      for (const Box& box : TensorBoxesIn(s, lo, hi == 0 ? SIZE_MAX : hi)) {
        read(*t, box.start, box.count, b, s.offset + box.flat - lo, box.numel);
        done += 4.0 * double(box.numel);
      }
    }
  bar.Finish(done, "");
}

VerifyResult Verify(const std::string& dir, bool progress) {
  VerifyResult v;
  v.dir = dir;
  CheckpointReader r;
  try {
    r = CheckpointReader::Open(dir);
  } catch (const Error& e) {
    const bool no_commit = !fs::exists(dir + "/COMMIT");
    v.status = no_commit ? "incomplete" : "corrupt";
    v.problem = e.what();
    return v;
  }
  const Manifest& m = r.manifest();
  v.step = m.step;
  v.tokens = m.tokens;
  v.tensors = m.tensors.size();
  try {  // the manifest against its model: what resume would refuse, verify refuses too
    CheckManifestModel(m, dir);
  } catch (const Error& e) {
    v.status = "corrupt";
    v.problem = e.what();
    return v;
  }
  std::vector<float> tmp;
  double total = 0;
  for (const TensorEntry& t : m.tensors)
    for (const Piece& p : t.pieces) total += double(p.bytes);
  Progress bar("verify " + dir, total, "B", progress);
  for (const TensorEntry& t : m.tensors) {
    uint64_t covered = 0;
    for (const Piece& p : t.pieces) {
      bar.Update(double(v.bytes));
      ++v.pieces;
      v.bytes += p.bytes;
      covered += p.bytes / 4;
      const std::string path = dir + "/" + p.file;
      BadPiece bad{t.name, t.kind, p.file, p.offset, p.bytes, ""};
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) {
        bad.problem = "missing file";
      } else if (uint64_t(st.st_size) < p.offset + p.bytes) {
        bad.problem = "short file (" + std::to_string(st.st_size) + " bytes)";
      } else {
        tmp.resize(p.bytes / 4);
        ReadAt(path, p.offset, p.bytes, tmp.data());
        const uint64_t h =
            PieceHash(tmp.data(), p.bytes, t.name, t.kind, p.start, p.count, m.version);
        if (h != p.xxh3) bad.problem = "xxh3 " + HashHex(h) + " != " + HashHex(p.xxh3);
      }
      if (!bad.problem.empty()) v.bad.push_back(bad);
    }
    if (covered != t.numel())
      v.bad.push_back({t.name, t.kind, "manifest.json", 0, 0,
                       "pieces cover " + std::to_string(covered) + " of " +
                           std::to_string(t.numel()) + " elements"});
  }
  bar.Finish(double(v.bytes), "");
  if (v.bad.empty()) {
    v.status = "committed";
  } else {
    v.status = "corrupt";
    const BadPiece& b = v.bad.front();
    v.problem = dir + "/" + b.file + ": " + b.tensor + " (" + b.kind + "): " + b.problem;
  }
  return v;
}

std::vector<std::string> CheckpointReader::LoadOwn(const std::vector<OwnBuffer>& own) const {
  std::vector<std::string> missing;
  for (const OwnBuffer& o : own) {
    const std::vector<int64_t> shape{int64_t(o.n)};
    const TensorEntry* t = manifest_.Find(o.name, kOwnKind);
    if (!(t && t->shape == shape) && !o.stand_in.empty()) {
      t = nullptr;
      for (const TensorEntry& e : manifest_.tensors)
        if (e.kind == kOwnKind && e.shape == shape &&
            ::fnmatch(o.stand_in.c_str(), e.name.c_str(), 0) == 0) {
          t = &e;
          break;
        }
    }
    if (t && t->shape == shape)
      ReadBox(*t, {0}, {int64_t(o.n)}, o.data);
    else {
      missing.push_back(o.name);
      if (!o.keep_if_missing) std::fill(o.data, o.data + o.n, 0.0f);
    }
  }
  return missing;
}

}  // namespace keel::ckpt
