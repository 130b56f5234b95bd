// Where a supervised run's wall time went: steps that count, steps trained twice (lost with a
// failure and recomputed from the last checkpoint), noticing a failure, restarting (stopping
// what was left, health checks, backoff), starting up (processes, MPI, loading the checkpoint),
// and the rest (validation, checkpoint waits, the supervisor's own start). Goodput is the share
// of wall time spent on steps that count.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace keel::resilience {

// One start of the job, in unix seconds; 0 where it never got that far.
struct Attempt {
  double spawn = 0;          // the launcher was started
  double loop_start = 0;     // the training loop began (after setup and the checkpoint load)
  double last_step_end = 0;  // the newest step finished
  double end = 0;            // the job ended, or the supervisor noticed it had failed
  double next_spawn = 0;     // the next start; 0 for the last attempt
  int start_step = -1;       // -1: never reached the loop
  int end_step = -1;
  std::string outcome;  // "finished", "failed: ...", "stopped", "regrow"
};

struct Goodput {
  double wall_s = 0;
  double useful_s = 0;     // steps that count
  double recompute_s = 0;  // steps trained again after a failure
  double detect_s = 0;     // from the last step before a failure to noticing it (the step
                           // cut short, then the launcher's and the supervisor's detection)
  double restart_s = 0;    // from noticing a failure (or a regrow) to the next start
  double startup_s = 0;    // from each start to its training loop
  double other_s = 0;
  int restarts = 0;
  double goodput() const { return wall_s > 0 ? useful_s / wall_s : 0; }
  nlohmann::json ToJson() const;
  std::string Text() const;  // a few lines for the console
};

Goodput Account(const std::vector<Attempt>& attempts, double wall_start, double wall_end);

}  // namespace keel::resilience
