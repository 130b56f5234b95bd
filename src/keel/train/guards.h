// The trainer's side of the detectors of docs/RESILIENCE.md (resilience/ holds the detectors
// themselves, which know nothing of communicators): the collectives that let every rank judge
// alike, and the run's record of rollbacks and skipped data.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "keel/monitor/jsonl.h"
#include "keel/parallel/comm.h"
#include "keel/resilience/fault_inject.h"
#include "keel/resilience/sdc.h"
#include "keel/resilience/spike.h"
#include "keel/resilience/straggler.h"
#include "keel/train/config.h"
#include "keel/train/step.h"

namespace keel::train {

// Every rank's host name, in rank order (one collective, at setup).
std::vector<std::string> GatherHosts(parallel::Comm& comm);
// Every rank's `mine` (>= 0), in rank order.
std::vector<double> GatherPerRank(parallel::Comm& comm, double mine);

// Silent data corruption: the bytes this rank's data-parallel replicas must hold identically
// (the fp32 master under ZeRO 0, the gathered working weights under ZeRO 1 and 2), hashed and
// compared over the dp group. Under ZeRO 3 no rank holds a replica: nothing is compared.
bool CanCompareReplicas(TrainStep& step, int zero);
uint64_t ReplicaHash(TrainStep& step, int zero);
// Under ZeRO 0 every dp rank holds the whole reduced gradient: its hash.
uint64_t GradHash(TrainStep& step);
resilience::Disagreement CompareReplicas(parallel::Comm& dp, uint64_t mine);
// Every dp rank takes the state of dp rank `from` (a majority rank): master weights and AdamW
// moments under ZeRO 0; under ZeRO 1 and 2 each rank's own master shard is republished.
void RepairReplicas(TrainStep& step, parallel::Comm& dp, int zero, int from);

// The step's verdict from its reduced loss and gradient norm, the same on every rank: a
// non-finite one is skipped, `max_skips` of them in a row or a spike (loss, and the norm when
// `norm_spike_ratio` > 0) ask for a rollback. Its windows and counts go into every checkpoint.
class StepJudge {
 public:
  explicit StepJudge(const ResilienceSection& rs);
  struct Verdict {
    bool nonfinite = false;
    int in_a_row = 0;                     // non-finite steps in a row, this one included
    std::optional<std::string> spike;     // why the step is a spike
    std::optional<std::string> rollback;  // why the run should roll back
  };
  Verdict Judge(double loss, double norm);
  void Applied(double loss, double norm);   // the update went in: the windows take the step
  void NoRollback() { skips_in_row_ = 0; }  // nothing to roll back to: count afresh
  nlohmann::json ToJson() const;
  void FromJson(const nlohmann::json& j);

 private:
  const ResilienceSection& rs_;
  resilience::SpikeDetector loss_, norm_;
  int skips_in_row_ = 0, skipped_steps_ = 0;
};

// Every `straggler_every` steps (collective over `world`): each rank's compute since the last
// check, scored against the ranks of its `group` (its pipeline stage); a rank named
// (`straggler_checks` slow checks in a row) goes to the log and `events` (rank 0's, else null).
// Returns the scores, empty when no check ran. With `straggler_fails` a named rank ends the job:
// keel::Error, exit 75 (`blame_self` first on it). `named_line` (optional) receives the first named
// rank's line.
std::vector<double> CheckStragglers(resilience::StragglerTracker& tracker, parallel::Comm& world,
                                    double compute_ms, int group, int step_done,
                                    const ResilienceSection& rs,
                                    const std::vector<std::string>& hosts,
                                    monitor::JsonlWriter* events,
                                    const std::function<void()>& blame_self,
                                    std::string* named_line = nullptr);

// One silent-corruption check (docs/RESILIENCE.md), after a step's forward and backward: the
// replicas compare their weights, then (ZeRO 0) their reduced gradients. On a disagreement the
// minority is repaired from a majority rank and `rerun` runs the step again on the same data; if
// the replicas still disagree the fault is persistent. Throws keel::Error (exit 75) then, or at
// once when no majority tells which replica is wrong; `blame_self` runs first on the rank at
// fault. Returns when the replicas agree (after a transient fault: repaired and re-run).
struct ReplicaCheck {
  TrainStep& step;
  parallel::Comm& dp;
  int zero;
  int world_rank;
  const std::vector<double>& dp_world_ranks;  // the world rank of each dp peer
  const std::vector<std::string>& hosts;      // by world rank
  monitor::JsonlWriter* events;               // the run's events (rank 0), or null
};
void CheckReplicas(const ReplicaCheck& c, int step_done, const std::function<void()>& rerun,
                   const std::function<void()>& blame_self);

// KEEL_FAULT bitflip: flips the bit in this rank's fp32 master copy of the parameter, if it
// holds that element.
void FlipBit(TrainStep& step, const resilience::Fault& f, int rank);

// RUN/rollbacks.json: every rollback of the run and the data it skipped. The skips are honoured
// on every later resume, and [resilience] skip_batches adds the user's own.
class RollbackLog {
 public:
  // `text`: the file at `path` as rank 0 read it (SharedRollbackFile; none yet: nullopt).
  RollbackLog(std::string path, const std::optional<std::string>& text,
              std::map<int, int> configured);
  // Global batches to skip at step boundary `step` (0 if none).
  int SkipAt(int step) const;
  // Records a rollback from `spike_step` (1-based, as logged) to `to_step` that skips `batches` at
  // `to_step` (replacing an earlier skip there, and silencing those at the steps replayed after
  // it: the batches cover them); rank 0 writes the file.
  void Record(int spike_step, int to_step, int batches, const std::string& why, bool write);
  // Rollbacks whose spike fell within `window` steps up to `step`.
  int RecentRollbacks(int step, int window) const;

 private:
  std::string path_;
  std::map<int, int> configured_, recorded_;
  nlohmann::json rollbacks_ = nlohmann::json::array();
};

// The rollbacks' file (RUN/rollbacks.json) as rank 0 reads it, on every rank of `comm`
// (collective): only rank 0 writes it, and every rank must skip the same batches, also where the
// run folder is not on storage every rank sees. nullopt when there is none; an unreadable one is
// the same error on every rank.
std::optional<std::string> SharedRollbackFile(parallel::Comm& comm, const std::string& path);

}  // namespace keel::train
