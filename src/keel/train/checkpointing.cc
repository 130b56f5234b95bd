#include "keel/train/checkpointing.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/reader.h"
#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/core/stats.h"
#include "keel/core/timer.h"
#include "keel/train/saved_layout.h"

namespace keel::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

enum SaveState { kNone = 0, kWriting = 1, kCommitting = 2 };

}  // namespace

std::string CheckpointRootOf(const RunConfig& cfg, const std::string& run_dir) {
  return cfg.checkpoint.dir.empty() ? run_dir + "/checkpoints" : cfg.checkpoint.dir;
}

std::vector<std::string> ResumeCandidates(const std::string& how, const std::string& root) {
  if (how.empty()) return {};
  if (how != "auto" && ckpt::ParseStepDirName(fs::path(how).filename().string())) return {how};
  std::vector<std::string> out;
  const auto dirs = ckpt::ListStepDirs(how == "auto" ? root : ckpt::CheckpointRoot(how));
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) out.push_back(it->path);
  return out;
}

Checkpointer::Checkpointer(const RunConfig& cfg, parallel::Comm& comm, std::string run_dir,
                           monitor::JsonlWriter* events, const Memory& state_memory)
    : cfg_(cfg),
      comm_(comm),
      run_dir_(std::move(run_dir)),
      root_(CheckpointRootOf(cfg, run_dir_)),
      events_(events),
      writer_(std::make_unique<ckpt::CheckpointWriter>(
          root_, comm.rank(), comm.size(),
          ckpt::Retention{cfg.checkpoint.keep_last, cfg.checkpoint.keep_every},
          cfg.checkpoint.writer_nice, cfg.checkpoint.direct_io, state_memory)),
      mem_(&state_memory),
      last_save_(std::chrono::steady_clock::now()) {
  if (cfg.checkpoint.peer_every > 0) {
    peer_ = PeerTierFromEnv(run_dir_);
    if (!peer_)
      ThrowBadInput(std::string("[checkpoint] peer_every: tier-0 copies go to the holders that "
                                "keel launch starts on each host ($") +
                    kPeerHoldersEnv + " is not set): run under keel launch, or set peer_every = 0");
    writer_->ShareStaging();  // this host's holder reads the copies from the staging memfd
  }
}

std::vector<Checkpointer::Candidate> Checkpointer::Folders(const std::vector<std::string>& dirs) {
  std::vector<Candidate> out;
  for (const std::string& d : dirs) out.push_back({d});
  return out;
}

Checkpointer::~Checkpointer() = default;

void Checkpointer::CheckResumeRequest() const {
  const std::string& how = cfg_.checkpoint.resume;
  if (how.empty()) {
    auto dirs = ckpt::ListStepDirs(root_);
    if (!dirs.empty())
      ThrowBadInput(root_ + ": holds checkpoints (newest " + dirs.back().name +
                    "): pass --resume auto to continue that run, or set [train] name for a new "
                    "one");
  } else if (how != "auto" && !fs::is_directory(how)) {
    ThrowBadInput("[checkpoint] resume: " + how +
                  ": no such checkpoint folder (expected \"auto\" or a step_N folder)");
  }
}

std::optional<Resumed> Checkpointer::Resume(const ckpt::StateView& view) {
  const std::string& how = cfg_.checkpoint.resume;
  const bool lead = comm_.rank() == 0;
  // A fresh start drops what the holders keep of an earlier run in this folder, which a later
  // restart would otherwise take for this one's.
  if (peer_ && lead && how.empty()) TrimPeerCopies(*peer_, -1);
  if (how.empty()) return std::nullopt;
  // "auto", or a checkpoints folder: newest first, skipping what does not verify. A step folder:
  // that one or an error.
  std::vector<Candidate> candidates = Folders(ResumeCandidates(how, root_));
  const bool search = how == "auto" || !ckpt::ParseStepDirName(fs::path(how).filename().string());
  if (how == "auto" && peer_) {
    // Rank 0 asks the holders; every rank then tries the same copies, newest first (the holders
    // keep two), before the shared checkpoints they are at least as new as.
    const auto newest =
        candidates.empty()
            ? std::nullopt
            : ckpt::ParseStepDirName(fs::path(candidates[0].name).filename().string());
    double steps[2] = {-1, -1};
    if (lead) {
      const std::vector<int64_t> whole = WholePeerCopies(*peer_);
      for (size_t i = 0; i < whole.size() && i < 2; ++i) steps[i] = double(whole[i]);
    }
    comm_.AllReduceMax(steps, 2);
    for (int i = 1; i >= 0; --i)
      if (steps[i] >= 0 && int64_t(steps[i]) >= newest.value_or(-1))
        candidates.insert(candidates.begin(), {"peer:" + ckpt::StepDirName(int64_t(steps[i])),
                                               int64_t(steps[i]), true});
  }
  if (search) {
    const std::string root = how == "auto" ? root_ : ckpt::CheckpointRoot(how);
    // Saves cut short are never loaded; say so, since they may be newer than what is resumed.
    for (const auto& t : ckpt::ListTmpDirs(root)) {
      if (!lead) break;
      Log("keel: ignoring %s: a save that never committed (or a replaced copy)", t.path.c_str());
      if (events_)
        events_->Write({{"event", "checkpoint_rejected"},
                        {"path", t.path},
                        {"reason", "incomplete: never committed"}});
    }
    if (candidates.empty()) {
      if (how != "auto") ThrowBadInput("[checkpoint] resume: " + how + ": no step_N folder in it");
      if (lead) {
        if (peer_) TrimPeerCopies(*peer_, -1);
        Log("keel: --resume auto: no checkpoint in %s; starting from step 0", root.c_str());
        if (events_) events_->Write({{"event", "resume_none"}, {"root", root}});
      }
      return std::nullopt;
    }
  }
  return LoadFirst(view, candidates, search, how == "auto" ? root_ : how);
}

std::optional<Resumed> Checkpointer::RollBack(const ckpt::StateView& view, int64_t max_step) {
  Complete();  // a save in flight commits (or fails) first: it may be the one to return to
  Report();
  // Rank 0 lists the candidates for every rank: only its Complete() committed the save in flight
  // (the others' returned once their own files were written), so a list of their own could miss
  // that folder, and ranks that load different steps end the run.
  std::string names;
  if (comm_.rank() == 0) {
    auto dirs = ckpt::ListStepDirs(root_);
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
      if (it->step <= max_step) names += it->path + "\n";
  }
  comm_.BroadcastString(names, 0);
  std::vector<Candidate> candidates;
  for (size_t at = 0, end; (end = names.find('\n', at)) != std::string::npos; at = end + 1)
    candidates.push_back({names.substr(at, end - at)});
  if (candidates.empty()) return std::nullopt;
  return LoadFirst(view, candidates, /*search=*/true, root_);
}

std::optional<Resumed> Checkpointer::LoadFirst(const ckpt::StateView& view,
                                               const std::vector<Candidate>& candidates,
                                               bool search, const std::string& where) {
  const bool lead = comm_.rank() == 0;
  // Each rank reads and verifies its pieces of a candidate; the verdicts are reduced, so that all
  // ranks take the newest checkpoint that verifies everywhere, together (one rank skipping a
  // candidate that the others loaded would leave their collectives out of step for good).
  enum Verdict { kLoaded = 0, kSkip = 1, kFatal = 2 };
  std::string first_bad;  // "DIR: rank R: reason" of the newest candidate refused, for the end
  for (const Candidate& cand : candidates) {
    const std::string& dir = cand.name;
    bool other_model = false;  // not a bad checkpoint but the wrong run: never skipped
    std::optional<Error> error;
    std::optional<ckpt::CheckpointReader> reader;
    std::vector<std::string> own_missing;
    PeerRead read;
    Timer load;
    try {
      reader.emplace(cand.peer ? OpenPeerCopy(*peer_, cand.step, &read)
                               : ckpt::CheckpointReader::Open(dir));
      other_model = true;
      ckpt::CheckSameModel(reader->manifest(), cfg_.ResolvedModel(), dir);
      other_model = false;
      ckpt::CheckManifestModel(reader->manifest(), dir);
      reader->Load(view.tensors, view.buffers, view.lo, view.hi, /*progress=*/lead, *mem_);
      own_missing = reader->LoadOwn(view.own);
    } catch (const Error& e) {
      error = e;
    } catch (const std::exception& e) {
      // Out of memory, a malformed sidecar's types: this rank's verdict, never an exception that
      // leaves the others waiting in the all-reduce below.
      error = Error(ExitCode::kBadInput, dir + ": " + e.what());
    }
    // A tier-0 copy that cannot be read whole is skipped like a folder that does not verify.
    const int mine = !error ? kLoaded : (!search || other_model) && !cand.peer ? kFatal : kSkip;
    const int verdict = int(comm_.AllReduceMax(double(mine)));
    if (verdict == kFatal) {
      if (mine == kFatal) throw *error;
      throw Error(ExitCode::kBadInput, "", /*quiet=*/true);  // the rank that found it says why
    }
    if (verdict == kSkip) {
      // The rank that refused it says why; the others name the checkpoint once (rank 0).
      if (error)
        Log("keel: skipping checkpoint %s: rank %d: %s", dir.c_str(), comm_.rank(), error->what());
      else if (lead)
        Log("keel: skipping checkpoint %s: another rank's pieces do not verify", dir.c_str());
      if (lead && events_)
        events_->Write({{"event", "checkpoint_rejected"},
                        {"path", dir},
                        {"reason", error ? std::string(error->what()) : "another rank's pieces"}});
      if (first_bad.empty())
        first_bad = dir + (error ? ": " + std::string(error->what()) : ": refused by a rank");
      continue;
    }
    const ckpt::Manifest& m = reader->manifest();
    // Every rank reads the same files; a disagreement means they see different storage.
    const double step = double(m.step);
    if (comm_.AllReduceMax(step) != step || -comm_.AllReduceMax(-step) != step)
      ThrowRuntime("ranks resumed from different checkpoints (rank " +
                   std::to_string(comm_.rank()) + " from " + dir +
                   "): is the checkpoint folder on storage every rank sees?");
    const int missing = int(comm_.AllReduceSum(double(own_missing.size())));
    if (lead && missing > 0)
      Log("keel: %d of the ranks' own tensors (int8 residuals, DiLoCo replicas' state) are not "
          "in %s (saved under another layout or configuration): residuals start from zero, "
          "replicas from the checkpoint's shared weights and moments",
          missing, dir.c_str());
    if (!cand.peer && fs::path(dir).parent_path() == fs::path(root_))
      writer_->Seed(m, fs::path(dir).filename().string());
    if (peer_ && lead) TrimPeerCopies(*peer_, m.step);
    const double load_ms = load.Millis();
    json event = {{"event", "restart"}, {"tier", cand.peer ? "peer" : "shared"},
                  {"from", dir},        {"step", m.step},
                  {"tokens", m.tokens}, {"load_ms", load_ms}};
    std::string where_from = dir;
    if (cand.peer) {
      double files[3] = {double(read.own_copies), double(read.buddy_copies),
                         double(read.from_local_disk)};
      comm_.AllReduceSum(files, 3);
      if (!read.buddy_files.empty()) {
        std::string list;
        for (const std::string& f : read.buddy_files) list += (list.empty() ? "" : ", ") + f;
        Log("keel: rank %d read the buddy's copy of %s (the writer's host lost its own)",
            comm_.rank(), list.c_str());
      }
      event["files_from_own_copies"] = files[0];
      event["files_from_buddy_copies"] = files[1];
      event["files_from_local_disk"] = files[2];
      char how_read[200];
      std::snprintf(
          how_read, sizeof how_read,
          "the tier-0 copy in the holders' memory; files read by the ranks: %.0f from the "
          "writer's own host's copy, %.0f from the buddy's, %.0f reloaded from a local "
          "disk",
          files[0], files[1], files[2]);
      where_from = how_read;
    }
    if (lead) {
      const int saved_by = RanksThatSaved(m.state);
      Log("keel: resuming from %s (step %lld, %llu tokens, saved by %d rank(s)); read and "
          "verified %.1f MiB in %.0f ms",
          where_from.c_str(), static_cast<long long>(m.step),
          static_cast<unsigned long long>(m.tokens), saved_by, m.TotalBytes() / 1048576.0, load_ms);
      if (events_) events_->Write(event);
    }
    return Resumed{dir, m.step, m.tokens, m.state, std::move(own_missing)};
  }
  // Every rank comes here together; rank 0 says it, the others exit with the same code.
  if (!lead) throw Error(ExitCode::kBadInput, "", /*quiet=*/true);
  ThrowBadInput("[checkpoint] resume: none of the " + std::to_string(candidates.size()) +
                " checkpoints in " + where + " verifies on every rank (the newest: " + first_bad +
                "); refusing to start over from step 0");
}

void Checkpointer::Prepare(const ckpt::StateView& view) {
  const auto& c = cfg_.checkpoint;
  if (c.every_steps > 0 || c.every_minutes > 0 || c.at_end || c.on_signal || c.peer_every > 0)
    writer_->Prepare(view);
}

double Checkpointer::BeforeUpdate() {
  if (save_state_ != kWriting) return 0;
  const double ms = writer_->WaitSnapshot();
  pending_blocked_ms_ += ms;
  return ms;
}

double Checkpointer::NoteStep(double step_ms) {
  if (save_state_ != kWriting) {
    clean_ms_.push_back(step_ms);
    if (clean_ms_.size() > 20) clean_ms_.pop_front();
    return -1;
  }
  if (clean_ms_.empty()) return 0;  // nothing to compare with yet
  const double lost = std::max(0.0, step_ms - WindowMedian({clean_ms_.begin(), clean_ms_.end()}));
  pending_lost_ms_ += lost;
  ++pending_overlapped_;
  return lost;
}

void Checkpointer::Begin(const ckpt::StateView& view, std::optional<ckpt::PeerTarget> peer) {
  if (save_state_ == kCommitting) {
    writer_->Drain();  // rank 0's commit of the previous save: small files and fsyncs
    save_state_ = kNone;
  }
  Report();
  pending_blocked_ms_ = 0;
  pending_lost_ms_ = 0;
  pending_overlapped_ = 0;
  // every_minutes times the shared saves: a tier-0 copy does not stand in for one.
  if (!peer) last_save_ = std::chrono::steady_clock::now();
  pending_peer_ = peer.has_value();
  pending_step_ = view.step;
  writer_->Begin(view, std::move(peer));
  save_state_ = kWriting;
}

void Checkpointer::Abort() {
  writer_->Abort();
  // A tier-0 copy that some rank could not place leaves the holders with files of that step for
  // some ranks only; retention would then keep them at the expense of the previous whole copy.
  if (pending_peer_ && comm_.rank() == 0) TrimPeerCopies(*peer_, pending_step_ - 1);
}

void Checkpointer::Complete() {
  if (save_state_ == kCommitting) {
    writer_->Drain();
  } else if (save_state_ == kWriting) {
    const int worst = int(comm_.AllReduceMax(double(writer_->WaitWritten())));
    if (worst == ckpt::CheckpointWriter::kFailed)
      Abort();
    else
      writer_->Commit();
    writer_->Drain();
  }
  save_state_ = kNone;
}

StepDecision Checkpointer::AfterStep(int step_done, bool last_step, bool stop_requested,
                                     bool failed, const std::function<ckpt::StateView()>& make_view,
                                     bool must_save) {
  const auto& c = cfg_.checkpoint;
  const double minutes =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() / 60;
  // One all-reduce carries every decision: a signal on any rank, rank 0's clock, the worst
  // state of the save in flight (writing 1, failed 2), and a failure found on any rank.
  double v[4] = {stop_requested ? 1.0 : 0.0,
                 comm_.rank() == 0 && c.every_minutes > 0 && minutes >= c.every_minutes ? 1.0 : 0.0,
                 save_state_ == kWriting ? double(writer_->status()) : 0.0, failed ? 1.0 : 0.0};
  const Timer agree;
  comm_.AllReduceMax(v, 4);
  StepDecision d;
  d.agree_ms = agree.Millis();
  d.stop = v[0] > 0;
  d.failed = v[3] > 0;
  if (d.failed) return d;
  const int worst = int(v[2]);
  if (save_state_ == kWriting && worst != ckpt::CheckpointWriter::kWriting) {
    if (worst == ckpt::CheckpointWriter::kFailed)
      Abort();
    else
      writer_->Commit();
    save_state_ = kCommitting;
  }
  const bool final_save = (last_step && c.at_end) || (d.stop && c.on_signal) || must_save;
  const bool trigger =
      final_save || (c.every_steps > 0 && step_done % c.every_steps == 0) || v[1] > 0;
  if (trigger) {
    // if_busy = "skip" yields to a shared save in flight, never to a tier-0 copy.
    if (save_state_ == kWriting && c.if_busy == "skip" && !final_save && !pending_peer_) {
      if (comm_.rank() == 0) {
        Log("keel: step %d: checkpoint skipped, the previous one is still being written",
            step_done);
        if (events_) events_->Write({{"event", "checkpoint_skipped"}, {"step", step_done}});
      }
    } else {
      Timer t;
      Complete();  // the previous save, when it is still being written (if_busy = "wait")
      Begin(make_view());
      pending_blocked_ms_ += t.Millis();
      d.saved = true;
      if (final_save) {
        // Nothing is left to overlap with: the run waits for the whole save.
        Timer sync;
        Complete();
        pending_blocked_ms_ += sync.Millis();
        Report();
      }
      d.blocked_ms = t.Millis();
    }
  } else if (peer_ && c.peer_every > 0 && step_done % c.peer_every == 0 && !last_step && !d.stop) {
    // Tier 0 never waits: a copy still on its way (or a shared save) takes this one's turn.
    if (save_state_ == kWriting) {
      if (comm_.rank() == 0 && events_)
        events_->Write({{"event", "checkpoint_skipped"}, {"step", step_done}, {"tier", "peer"}});
    } else {
      Timer t;
      Begin(make_view(), peer_->Target(c.peer_rate_mbit));
      pending_blocked_ms_ += t.Millis();
      d.saved = true;
      d.blocked_ms = t.Millis();
    }
  }
  Report();
  return d;
}

void Checkpointer::Finish() {
  Complete();
  Report();
  if (last_failed_) ThrowRuntime("the last checkpoint failed: " + last_error_);
}

void Checkpointer::ReportPeer(const ckpt::SaveReport& r) {
  if (!r.error.empty()) {
    // The holders keep the previous complete copy; the shared checkpoints are untouched.
    Log("keel: tier-0 copy of step %lld failed: %s; training goes on",
        static_cast<long long>(r.step), r.error.c_str());
    if (events_)
      events_->Write(
          {{"event", "checkpoint_failed"}, {"step", r.step}, {"tier", "peer"}, {"error", r.error}});
    return;
  }
  if (comm_.rank() != 0) return;
  std::string to;
  for (const std::string& h : r.holders) to += (to.empty() ? "" : ", ") + h;
  Log("keel: tier-0 copy of step %lld: this rank's %.1f MiB to the holders on %s%s in %.0f ms, "
      "the step was blocked %.1f ms",
      static_cast<long long>(r.step), r.bytes / 1048576.0, to.c_str(),
      r.handed_over ? " (its own host's read it from memory)" : "", r.total_ms,
      pending_blocked_ms_);
  if (events_)
    events_->Write({{"event", "checkpoint"},
                    {"tier", "peer"},
                    {"step", r.step},
                    {"bytes", r.bytes},
                    {"holders", r.holders},
                    {"handed_over", r.handed_over},
                    {"blocked_ms", pending_blocked_ms_},
                    {"overlapped_steps", pending_overlapped_},
                    {"steps_lost_ms", pending_lost_ms_},
                    {"send_ms", r.write_ms},
                    {"total_ms", r.total_ms}});
}

void Checkpointer::Report() {
  for (const ckpt::SaveReport& r : writer_->TakeReports()) {
    if (r.path.rfind("peer:", 0) == 0) {
      ReportPeer(r);
      continue;
    }
    last_failed_ = !r.error.empty();
    last_error_ = r.error;
    if (!r.error.empty()) {
      Log("keel: checkpoint of step %lld failed: %s; training goes on, the committed checkpoints "
          "are untouched",
          static_cast<long long>(r.step), r.error.c_str());
      if (events_)
        events_->Write({{"event", "checkpoint_failed"}, {"step", r.step}, {"error", r.error}});
      continue;
    }
    if (comm_.rank() != 0) continue;
    std::string deleted;
    for (const auto& name : r.deleted) deleted += (deleted.empty() ? "" : ", ") + name;
    char unchanged[96] = "";
    if (r.referenced_bytes)
      std::snprintf(unchanged, sizeof unchanged, " (%.1f MiB unchanged: referenced, not rewritten)",
                    r.referenced_bytes / 1048576.0);
    char lost[128] = "";
    if (pending_overlapped_ > 0)
      std::snprintf(lost, sizeof lost,
                    "; the %d step(s) beside it took %.0f ms longer (%.0f%% of "
                    "the save's time)",
                    pending_overlapped_, pending_lost_ms_,
                    100 * pending_lost_ms_ / std::max(1.0, r.total_ms));
    Log("keel: checkpoint %s: %.1f MiB%s in %.0f ms (this rank staged %.1f MiB and wrote in %.0f "
        "ms), the step was blocked %.1f ms%s%s%s",
        r.path.c_str(), r.total_bytes / 1048576.0, unchanged, r.total_ms, r.bytes / 1048576.0,
        r.write_ms, pending_blocked_ms_, lost, deleted.empty() ? "" : "; deleted ",
        deleted.c_str());
    if (!r.warning.empty()) {
      Log("keel: checkpoint %s is committed, but %s (resume finds it all the same)", r.path.c_str(),
          r.warning.c_str());
      if (events_)
        events_->Write({{"event", "checkpoint_warning"},
                        {"step", r.step},
                        {"path", r.path},
                        {"warning", r.warning}});
    }
    if (on_commit_) on_commit_();
    if (events_)
      events_->Write({{"event", "checkpoint"},
                      {"step", r.step},
                      {"path", r.path},
                      {"bytes", r.total_bytes},
                      {"referenced_bytes", r.referenced_bytes},
                      {"blocked_ms", pending_blocked_ms_},
                      {"overlapped_steps", pending_overlapped_},
                      {"steps_lost_ms", pending_lost_ms_},
                      {"snapshot_ms", r.snapshot_ms},
                      {"write_ms", r.write_ms},
                      {"writer_user_ms", r.user_ms},
                      {"writer_sys_ms", r.sys_ms},
                      {"fsync_ms", r.fsync_ms},
                      {"direct_io", r.direct_io},
                      {"total_ms", r.total_ms},
                      {"deleted", r.deleted}});
  }
}

}  // namespace keel::train
