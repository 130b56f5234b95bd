// The trainer's side of checkpoints: when to save (every N steps, every M minutes, at the end, on
// a signal), the ranks' agreement on every decision, the asynchronous writer's progress, resume,
// and the log lines and events.jsonl records of all of it. Under `keel launch` with [checkpoint]
// peer_every, tier-0 copies go to holders' memory between the shared saves (peer_tier.h), and
// "auto" resumes from the newest of either.
//
// Every rank calls the same methods at the same steps: decisions go through one small all-reduce
// per step, so no rank saves, commits or stops alone (which would hang the next collective).
//
//   Checkpointer ck(cfg, comm, run_dir, &events);
//   std::optional<Resumed> r = ck.Resume(view);          // before the first step
//   for (...) {
//     ... forward, backward ...
//     blocked += ck.BeforeUpdate();                       // the snapshot must be taken
//     opt.Step(...);
//     if (ck.AfterStep(step, last, g_stop, make_view).stop) break;
//   }
//   ck.Finish();
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/ckpt/state.h"
#include "keel/ckpt/writer.h"
#include "keel/monitor/jsonl.h"
#include "keel/parallel/comm.h"
#include "keel/train/config.h"
#include "keel/train/peer_tier.h"

namespace keel::train {

struct Resumed {
  std::string path;
  int64_t step = 0;
  uint64_t tokens = 0;
  nlohmann::json state;  // Manifest::state
  // StateView::own tensors of this rank that the checkpoint did not hold (left as they were).
  std::vector<std::string> own_missing;
};

struct StepDecision {
  bool stop = false;      // every rank stops after this step (a signal)
  double blocked_ms = 0;  // what this call blocked the step (a synchronous save at the end)
  bool saved = false;     // a save began at this step
  bool failed = false;    // some rank reported a failure (`failed` below): every rank stops now
  double agree_ms = 0;    // in the decision's all-reduce: waiting for the slowest rank's step
};

// Where a run's checkpoints go: [checkpoint] dir, or RUN_DIR/checkpoints.
std::string CheckpointRootOf(const RunConfig& cfg, const std::string& run_dir);
// The checkpoints `[checkpoint] resume` (`how`) may resume from, newest first: "auto" (the run's
// `root`) or a checkpoints folder, every step_N folder in it; a step folder, that one.
std::vector<std::string> ResumeCandidates(const std::string& how, const std::string& root);

class Checkpointer {
 public:
  // `state_memory`: where the step's state lives (its backend's memory).
  Checkpointer(const RunConfig& cfg, parallel::Comm& comm, std::string run_dir,
               monitor::JsonlWriter* events, const Memory& state_memory = HostMemory());
  ~Checkpointer();

  const std::string& root() const { return root_; }

  // Which checkpoint [checkpoint] resume asks for, checked before anything is written: "" finds
  // none (and refuses a run folder that has checkpoints, which a fresh start would mix with its
  // own), "auto" the newest committed one or none, a path that folder. Loads nothing.
  void CheckResumeRequest() const;
  // Loads the state into `view`'s buffers. "auto" tries committed checkpoints newest first and
  // skips (with a log line and an event) any that does not verify. nullopt: a fresh start.
  std::optional<Resumed> Resume(const ckpt::StateView& view);
  // A rollback (a loss spike): completes any save in flight, then loads the newest committed
  // checkpoint of this run at or before `max_step` that verifies. nullopt: there is none.
  std::optional<Resumed> RollBack(const ckpt::StateView& view, int64_t max_step);

  // Readies the writer for saves of `view` in the background (its staging buffer), when this run
  // saves at all.
  void Prepare(const ckpt::StateView& view);
  // Before the optimizer changes the state: waits for the snapshot of a save in flight.
  double BeforeUpdate();
  // After step `step_done` (1-based): agrees with the other ranks, advances the save in flight,
  // and begins a save when a trigger fires (`make_view` gives the state to save).
  // `must_save`: save now and wait for it, whatever [checkpoint] says (an fp16 run switching to
  // bf16 resumes from it).
  StepDecision AfterStep(int step_done, bool last_step, bool stop_requested, bool failed,
                         const std::function<ckpt::StateView()>& make_view, bool must_save = false);
  // Completes a save in flight (commit or abort), so that nothing is left half-done. Throws
  // keel::Error if the final save failed.
  void Finish();
  // Before AfterStep, the step's wall time so far. While a save is in flight, returns how much
  // longer the step took than the recent steps without one (the save's cost to training, which
  // the commit's line and event sum up); -1 when no save was in flight.
  double NoteStep(double step_ms);
  // Called (on the training thread) when a save commits.
  void set_on_commit(std::function<void()> f) { on_commit_ = std::move(f); }

 private:
  void Begin(const ckpt::StateView& view, std::optional<ckpt::PeerTarget> peer = std::nullopt);
  // A checkpoint to resume from: a folder, or a tier-0 copy in the holders ("peer:step_N").
  struct Candidate {
    std::string name;
    int64_t step = -1;  // a tier-0 copy's
    bool peer = false;
  };
  static std::vector<Candidate> Folders(const std::vector<std::string>& dirs);
  // The first of `candidates` that loads and verifies; with `search`, skipping (and saying so)
  // those that do not.
  std::optional<Resumed> LoadFirst(const ckpt::StateView& view,
                                   const std::vector<Candidate>& candidates, bool search,
                                   const std::string& where);
  // Waits until every rank's part is written or failed, then commits or aborts it everywhere.
  void Complete();
  void Report();
  void ReportPeer(const ckpt::SaveReport& r);
  void Abort();  // the save in flight, on every rank

  const RunConfig& cfg_;
  parallel::Comm& comm_;
  const std::string run_dir_, root_;
  monitor::JsonlWriter* events_;
  std::function<void()> on_commit_;
  std::unique_ptr<ckpt::CheckpointWriter> writer_;
  std::optional<PeerTier> peer_;  // where tier-0 copies go ([checkpoint] peer_every)
  bool pending_peer_ = false;     // the save in flight is a tier-0 copy
  int64_t pending_step_ = 0;
  const Memory* mem_;
  std::chrono::steady_clock::time_point last_save_;
  int save_state_ = 0;             // none, writing (not yet agreed), committing
  double pending_blocked_ms_ = 0;  // the current save's blocked time so far
  double pending_lost_ms_ = 0;     // what the steps beside it took beyond the usual
  int pending_overlapped_ = 0;     // and how many they were
  std::deque<double> clean_ms_;    // the last steps with no save in flight
  bool last_failed_ = false;
  std::string last_error_;
};

}  // namespace keel::train
