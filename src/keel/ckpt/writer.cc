// The writer thread runs one task at a time from a queue, so a commit or an abort never overlaps a
// snapshot or a write of the same rank, and the trainer's thread only ever waits for a snapshot.
#include "keel/ckpt/writer.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/fault.h"
#include "keel/ckpt/manifest.h"
#include "keel/ckpt/manifest_build.h"
#include "keel/ckpt/retention.h"
#include "keel/ckpt/writer_internal.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/timer.h"
#include "keel/parallel/dims.h"

namespace keel::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The committed folder `tmp` in place of `final_dir`, which holds a checkpoint of the same step
// from an earlier attempt (a resume from an older one). Where the file system exchanges two
// names in one rename (RENAME_EXCHANGE: ext4, XFS, btrfs, tmpfs) there is no moment without a
// step folder; elsewhere (NFS) the old one is moved aside, and put back if the new one cannot
// take its place. The old one is removed only once the new name is durable. (renameat2 and
// RENAME_EXCHANGE come from <cstdio> under _GNU_SOURCE, which g++ and clang++ define on Linux.)
void ReplaceStepDir(const std::string& root, const std::string& tmp, const std::string& final_dir,
                    const std::string& aside) {
  std::error_code ec;  // the old one's removal may fail: it goes with retention then
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    SyncDir(root);
    fs::remove_all(tmp, ec);  // now the old one
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)  // not "cannot exchange here"
    throw Error(ExitCode::kRuntime,
                "cannot put " + tmp + " in place of " + final_dir + ": " + std::strerror(errno));
  fs::remove_all(aside);
  fs::rename(final_dir, aside);
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    std::error_code back;
    fs::rename(aside, final_dir, back);
    throw Error(ExitCode::kRuntime,
                "cannot put " + tmp + " in place of " + final_dir + ": " + ec.message() +
                    (back ? "; the earlier checkpoint could not be put back either and is in " +
                                aside + " (" + back.message() + ")"
                          : ""));
  }
  SyncDir(root);
  fs::remove_all(aside, ec);
}

}  // namespace

// Writes all of `bytes`, retrying short writes; throws with the path, progress and errno text.
void WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const size_t chunk = std::min<size_t>(n - done, size_t(64) << 20);
    ssize_t w = ::write(fd, p + done, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw Error(ExitCode::kRuntime, path + ": write failed after " + std::to_string(done) +
                                          " of " + std::to_string(n) +
                                          " bytes: " + std::strerror(w < 0 ? errno : ENOSPC));
    done += size_t(w);
  }
}

CheckpointWriter::CheckpointWriter(std::string root, int rank, int world, Retention retention,
                                   int nice, bool direct_io, const Memory& state_memory)
    : root_(std::move(root)),
      rank_(rank),
      world_(world),
      retention_(retention),
      nice_(nice),
      direct_io_(direct_io) {
  mem_ = &state_memory;
  thread_ = std::thread([this] { Run(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (staging_) mem_->UnpinHost(staging_.get());
}

void CheckpointWriter::Run() {
  // A per-thread nice on Linux: the step's threads keep their own priority.
  if (nice_ > 0) (void)setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), nice_);
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    task();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void CheckpointWriter::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void CheckpointWriter::Begin(StateView view, std::optional<PeerTarget> peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KEEL_CHECK(!in_flight_, "CheckpointWriter::Begin with a save in flight");
    in_flight_ = true;
    snapshot_done_ = false;
    chunks_ready_ = false;
    sources_released_ = std::all_of(view.buffers.begin(), view.buffers.end(),
                                    [](const FlatBuffer& b) { return b.data != nullptr; });
    status_ = kWriting;
  }
  begin_ms_ = NowMs();
  own_copies_.resize(view.own.size());
  for (size_t i = 0; i < view.own.size(); ++i) {
    OwnBuffer& o = view.own[i];
    own_copies_[i].assign(o.data, o.data + o.n);
    o.data = own_copies_[i].data();
  }
  Post([this, v = std::move(view), peer = std::move(peer)] {
    try {
      DoSnapshot(v);
    } catch (const std::exception& e) {
      Fail(e.what());
    }
    // Also when the snapshot failed: the report must say it was a tier-0 copy.
    if (peer) current_.path = "peer:" + StepDirName(v.step);
    {
      std::lock_guard<std::mutex> lock(mu_);
      snapshot_done_ = true;
    }
    cv_.notify_all();
    if (status() != kFailed) {
      try {
        if (peer)
          DoSend(*peer);
        else
          DoWrite();
      } catch (const std::exception& e) {
        Fail(e.what());
      }
    }
    ReleaseSources();  // whatever happened: the trainer's next update may go on
  });
}

uint64_t CheckpointWriter::WriteDeferred(int fd, const Deferred& d, const json& p,
                                         const std::string& path) {
  HashStream hash(PieceSeed(p["name"].get<std::string>(), p["kind"].get<std::string>(),
                            p["start"].get<std::vector<int64_t>>(),
                            p["count"].get<std::vector<int64_t>>()));
  constexpr size_t kSlice = size_t(2) << 20;  // elements: 8 MiB as fp32
  std::vector<uint8_t> buf(4 * std::min(kSlice, d.n));
  for (size_t off = 0; off < d.n; off += kSlice) {
    const size_t k = std::min(kSlice, d.n - off);
    sources_[size_t(d.source)](d.at + off, k, buf.data());  // bf16 into the first half
    if (d.widen) WidenInPlace(buf.data(), k);
    hash.Update(buf.data(), 4 * k);
    WriteAll(fd, buf.data(), 4 * k, path);
  }
  return hash.Digest();
}

void CheckpointWriter::ReleaseSources() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sources_released_ = true;
  }
  cv_.notify_all();
}

double CheckpointWriter::WaitSnapshot() {
  Timer t;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return snapshot_done_ || chunks_ready_; });
    if (snapshot_done_) {
      cv_.wait(lock, [&] { return sources_released_; });  // an offload tier's pieces, read
      return t.Millis();
    }
  }
  // The copy is not finished and the state is about to change: the trainer's threads copy the
  // rest beside the writer, at the whole machine's memory bandwidth rather than one thread's.
#pragma omp parallel
  CopyChunks();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return snapshot_done_ && sources_released_; });
  return t.Millis();
}

CheckpointWriter::Status CheckpointWriter::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

CheckpointWriter::Status CheckpointWriter::WaitWritten() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return status_ != kWriting; });
  return status_;
}

bool CheckpointWriter::in_flight() {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void CheckpointWriter::Fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = kFailed;
  current_.error = what;
}

void CheckpointWriter::Commit() {
  Post([this] {
    try {
      const bool peer = current_.path.rfind("peer:", 0) == 0;  // nothing to commit
      if (rank_ == 0 && !peer) DoCommit();
      if (!peer) prev_ = std::move(next_prev_);  // what the next save may reference
    } catch (const std::exception& e) {
      current_.error = e.what();
      DoAbort();
    }
    current_.total_ms = NowMs() - begin_ms_;
    std::lock_guard<std::mutex> lock(mu_);
    reports_.push_back(current_);
    in_flight_ = false;
    status_ = kWritten;
  });
}

void CheckpointWriter::Abort() {
  Post([this] {
    DoAbort();
    current_.total_ms = NowMs() - begin_ms_;
    std::lock_guard<std::mutex> lock(mu_);
    if (current_.error.empty()) current_.error = "another rank failed to write its part";
    reports_.push_back(current_);
    in_flight_ = false;
    status_ = kWritten;
  });
}

void CheckpointWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return tasks_.empty() && !busy_; });
}

std::vector<SaveReport> CheckpointWriter::TakeReports() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(reports_, {});
}

void CheckpointWriter::Seed(const Manifest& m, const std::string& dir_name) {
  std::map<std::string, Stored> seeded;
  for (const TensorEntry& t : m.tensors)
    for (const Piece& p : t.pieces) {
      json start = p.start, count = p.count;
      const std::string file =
          p.file.rfind("../", 0) == 0 ? p.file.substr(3) : dir_name + "/" + p.file;
      seeded[t.name + "|" + t.kind + "|" + start.dump() + count.dump()] = {file, p.offset, p.bytes,
                                                                           p.xxh3};
    }
  Post([this, s = std::move(seeded)]() mutable { prev_ = std::move(s); });
}

void CheckpointWriter::DoWrite() {
  Timer t;
  const auto cpu0 = ThreadCpuMs();
  const std::string tmp = current_.path;
  fs::create_directories(tmp);
  if (rank_ == 0) {
    // A folder left by a crash in an earlier attempt at this step: what rank 0 writes itself
    // must not survive into this attempt (the other ranks overwrite their own files).
    fs::remove(tmp + "/COMMIT");
    fs::remove(tmp + "/manifest.json");
  }
  const std::string name = fs::path(tmp).stem().string();  // step_N
  const std::string path = tmp + "/" + RankFile(rank_, "bin");
  json pieces = json::parse(pieces_json_);
  const uint8_t* base = staging_.get();
  next_prev_.clear();
  current_.referenced_bytes = 0;
  // First what goes where: each piece hashed, and written unless an older file holds its bytes.
  // A deferred piece (an offload tier's) is always written, and hashed as it is read.
  struct Run {
    const uint8_t* bytes;  // null: deferred piece `piece`
    uint64_t n;
    size_t piece;
  };
  std::vector<Run> runs;
  std::vector<std::string> keys;
  uint64_t file_offset = 0;
  bool any_deferred = false;
  for (size_t i = 0; i < pieces.size(); ++i) {
    json& p = pieces[i];
    const uint64_t n = p["bytes"].get<uint64_t>();
    const std::string key = p["name"].get<std::string>() + "|" + p["kind"].get<std::string>() +
                            "|" + p["start"].dump() + p["count"].dump();
    keys.push_back(key);
    if (deferred_[i].source >= 0) {
      runs.push_back({nullptr, n, i});
      p["file"] = RankFile(rank_, "bin");
      p["offset"] = file_offset;
      file_offset += n;
      any_deferred = true;
      continue;
    }
    const uint8_t* bytes = base + p["offset"].get<size_t>();
    const uint64_t h =
        PieceHash(bytes, n, p["name"].get<std::string>(), p["kind"].get<std::string>(),
                  p["start"].get<std::vector<int64_t>>(), p["count"].get<std::vector<int64_t>>());
    // Incremental: a piece with the bytes of the previous save (a frozen parameter) is
    // referenced where it already lies, as long as that committed file is still there.
    auto it = prev_.find(key);
    if (it != prev_.end() && it->second.xxh3 == h && it->second.bytes == n &&
        fs::exists(root_ + "/" + it->second.file)) {
      p["file"] = "../" + it->second.file;
      p["offset"] = it->second.offset;
      next_prev_[key] = it->second;
      current_.referenced_bytes += n;
    } else {
      runs.push_back({bytes, n, i});
      p["file"] = RankFile(rank_, "bin");
      p["offset"] = file_offset;
      next_prev_[key] = {name + "/" + RankFile(rank_, "bin"), file_offset, n, h};
      file_offset += n;
    }
    p["xxh3"] = HashHex(h);
  }
  // With nothing referenced the file is the staging buffer's first bytes: written with O_DIRECT
  // (the buffer is 2 MiB aligned and zero past its end), the kernel neither copies it into the
  // page cache nor writes it back later. Where the file system refuses O_DIRECT (tmpfs), or
  // pieces are referenced, the plain path.
  int fd = -1;
  const bool direct =
      direct_io_ && current_.referenced_bytes == 0 && file_offset > 0 && !any_deferred;
  if (direct) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  bool went_direct = fd >= 0;
  if (went_direct) {
    // Some file systems open with O_DIRECT and then refuse the writes (EINVAL): those get the
    // plain path from the start of the file.
    constexpr uint64_t kBlock = 4096;
    try {
      WriteAll(fd, base, size_t((file_offset + kBlock - 1) / kBlock * kBlock), path);
      if (::ftruncate(fd, off_t(file_offset)) != 0)
        throw Error(ExitCode::kRuntime, path + ": ftruncate failed: " + std::strerror(errno));
    } catch (const Error&) {
      ::close(fd);
      fd = -1;
      went_direct = false;
    }
  }
  current_.direct_io = went_direct;
  if (fd < 0) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(ExitCode::kRuntime, path + ": cannot create: " + std::strerror(errno));
  try {
    if (!went_direct)
      for (const Run& r : runs) {
        if (r.bytes) {
          WriteAll(fd, r.bytes, r.n, path);
          continue;
        }
        json& p = pieces[r.piece];
        const uint64_t h = WriteDeferred(fd, deferred_[r.piece], p, path);
        p["xxh3"] = HashHex(h);
        next_prev_[keys[r.piece]] = {name + "/" + RankFile(rank_, "bin"),
                                     p["offset"].get<uint64_t>(), r.n, h};
      }
    ReleaseSources();  // every deferred piece is read: the state may change
    MaybeCrash("write");
    const Timer sync;
    if (::fsync(fd) != 0)
      throw Error(ExitCode::kRuntime, path + ": fsync failed: " + std::strerror(errno));
    current_.fsync_ms = sync.Millis();
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  WriteFileAtomic(tmp + "/" + RankFile(rank_, "json"), pieces.dump() + "\n");
  current_.write_ms = t.Millis();
  const auto [user, sys] = ThreadCpuMs();
  current_.user_ms += user - cpu0.first;
  current_.sys_ms += sys - cpu0.second;
  MaybeCrash("written");
  std::lock_guard<std::mutex> lock(mu_);
  status_ = kWritten;
}

void CheckpointWriter::DoSend(const PeerTarget& t) {
  Timer timer;
  const auto cpu0 = ThreadCpuMs();
  for (const Deferred& d : deferred_)
    if (d.source >= 0)
      throw Error(ExitCode::kRuntime,
                  "a tier-0 copy needs the state in memory, and part of it is on an offload tier");
  json pieces = json::parse(pieces_json_);
  const uint8_t* base = staging_.get();
  // Each piece's hash (PieceHash, streamed) is taken on the slice the first holder's send is about
  // to read, while it is in cache: the copy is read from memory once for both, not three times
  // (on a 2-core host the passes of their own were a fifth of a copy's CPU, beside the step).
  struct Streamed {
    uint64_t off, n;
    HashStream hash;
  };
  std::vector<Streamed> hashes;
  hashes.reserve(pieces.size());
  uint64_t total = 0;
  for (json& p : pieces) {
    hashes.push_back(
        {p["offset"].get<uint64_t>(), p["bytes"].get<uint64_t>(),
         HashStream(PieceSeed(p["name"].get<std::string>(), p["kind"].get<std::string>(),
                              p["start"].get<std::vector<int64_t>>(),
                              p["count"].get<std::vector<int64_t>>()))});
    p["file"] = RankFile(rank_, "bin");
    total = std::max(total, hashes.back().off + hashes.back().n);
  }
  std::vector<size_t> order(hashes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return hashes[a].off < hashes[b].off; });
  size_t first_open = 0;  // in `order`: the pieces before it are hashed whole
  auto hash_slice = [&](size_t off, size_t len) {
    const uint64_t end = off + len;
    for (size_t i = first_open; i < order.size() && hashes[order[i]].off < end; ++i) {
      Streamed& h = hashes[order[i]];
      const uint64_t lo = std::max<uint64_t>(h.off, off), hi = std::min(h.off + h.n, end);
      if (lo < hi) h.hash.Update(base + lo, hi - lo);
      if (h.off + h.n <= end && i == first_open) ++first_open;
    }
  };
  // The sidecar goes after the bytes it describes, and a holder replaces an item only once it
  // arrived whole: a send cut off leaves the previous step's files as they were.
  auto key = [&](const std::string& file) { return peer::Key{t.run, meta_.step, file}.str(); };
  const std::string skeleton = rank_ == 0 ? ToJsonText(SkeletonManifest(meta_, world_)) : "";
  std::string side;
  bool hashed = false;  // the pieces' hashes are taken
  std::optional<uint64_t> file_hash;
  for (const peer::Address& a : t.holders) {
    const peer::Client c(a, 30);
    // This host's holder reads the staging memfd itself: the pieces and the file are hashed here
    // first (the same one read of the bytes the fused send makes), and no socket copies them.
    bool handed_over = false;
    if (staging_fd() >= 0 && c.local()) {
      if (!file_hash) {
        HashStream file;
        constexpr size_t kSlice = size_t(1) << 20;
        for (size_t off = 0; off < total; off += kSlice) {
          const size_t k = std::min(kSlice, total - off);
          if (!hashed) hash_slice(off, k);
          file.Update(base + off, k);
        }
        hashed = true;
        file_hash = file.Digest();
      }
      handed_over = c.PutLocal(key(RankFile(rank_, "bin")), staging_fd(), 0, total, *file_hash);
      current_.handed_over = current_.handed_over || handed_over;
    }
    // The file's hash is taken once, by the first copy: a later one sends it as it is.
    if (!handed_over)
      file_hash = c.Put(key(RankFile(rank_, "bin")), base, total, t.rate_mbit,
                        hashed ? std::function<void(size_t, size_t)>() : hash_slice, file_hash);
    hashed = true;
    if (side.empty()) {
      for (size_t i = 0; i < pieces.size(); ++i)
        pieces[i]["xxh3"] = HashHex(hashes[i].hash.Digest());
      // The sidecar names the host that wrote it, so that a restore can tell its own copy (on
      // that host's holder) from the buddy's.
      side = json{{"host", t.holders.at(0).host}, {"pieces", pieces}}.dump();
    }
    c.Put(key(RankFile(rank_, "json")), side.data(), side.size());
    if (rank_ == 0) c.Put(key("manifest.json"), skeleton.data(), skeleton.size());
    current_.holders.push_back(a.host);
  }
  current_.write_ms = timer.Millis();
  const auto [user, sys] = ThreadCpuMs();
  current_.user_ms += user - cpu0.first;
  current_.sys_ms += sys - cpu0.second;
  std::lock_guard<std::mutex> lock(mu_);
  status_ = kWritten;
}

void CheckpointWriter::DoCommit() {
  const std::string tmp = current_.path;
  const std::string name = StepDirName(meta_.step);
  const std::string final_dir = root_ + "/" + name;
  // Gather every rank's pieces into the global description, tensor by tensor, kind by kind.
  std::vector<std::pair<std::string, json>> sidecars;
  for (int r = 0; r < world_; ++r) {
    const std::string side = tmp + "/" + RankFile(r, "json");
    sidecars.emplace_back(side, json::parse(ReadWholeFile(side)));
  }
  Manifest m = SkeletonManifest(meta_, world_);
  AddRankPieces(m, sidecars);
  current_.total_bytes = m.TotalBytes();
  current_.referenced_bytes = 0;  // every rank's, now that rank 0 sees them all
  for (const TensorEntry& t : m.tensors)
    for (const Piece& p : t.pieces)
      if (p.file.rfind("../", 0) == 0) current_.referenced_bytes += p.bytes;
  const std::string text = ToJsonText(m);
  WriteFileAtomic(tmp + "/manifest.json", text);
  for (int r = 0; r < world_; ++r) fs::remove(tmp + "/" + RankFile(r, "json"));
  MaybeCrash("manifest");
  WriteFileAtomic(tmp + "/COMMIT", "xxh3 " + HashHex(Hash(text.data(), text.size())) + "\n");
  SyncDir(tmp);
  MaybeCrash("commit");
  if (fs::exists(final_dir))
    ReplaceStepDir(root_, tmp, final_dir, root_ + "/.replaced_" + name);
  else
    fs::rename(tmp, final_dir);
  SyncDir(root_);
  current_.path = final_dir;
  MaybeCrash("rename");
  // Committed: resume finds it without `latest`. A failure from here on (a full disk for
  // `latest`, a folder retention cannot remove) is reported with the save and never undoes it;
  // Commit's error path used to remove the folder just renamed into place (and, where the step
  // had been saved before, both copies).
  try {
    WriteFileAtomic(root_ + "/latest", name + "\n");
    MaybeCrash("latest");
    current_.deleted = ApplyRetention(root_, meta_.step, retention_);
  } catch (const std::exception& e) {
    current_.warning = e.what();
  }
}

void CheckpointWriter::DoAbort() {
  std::error_code ec;
  const std::string tmp = current_.path;
  if (tmp.rfind("peer:", 0) == 0) return;  // the holders keep the previous complete copy
  if (!tmp.ends_with(".tmp")) return;      // renamed into place: committed, never undone
  if (rank_ == 0) {
    fs::remove_all(tmp, ec);
  } else {
    fs::remove(tmp + "/" + RankFile(rank_, "bin"), ec);
    fs::remove(tmp + "/" + RankFile(rank_, "json"), ec);
  }
}

}  // namespace keel::ckpt
