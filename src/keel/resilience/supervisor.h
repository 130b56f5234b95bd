// The supervisor behind `keel launch`: starts the training job on the hosts it judges usable,
// watches the ranks' heartbeats, and when the job fails in a way worth restarting (a lost peer,
// a crash, a signal, a silent rank) stops what is left of it, excludes the hosts that failed,
// and starts it again from the newest checkpoint: on a spare, or on fewer data-parallel ranks.
// Bad input (exit 2) is never retried. SIGINT/SIGTERM ask the job to save and stop.
//
// Everything it does goes to RUN/events.jsonl (launch_start, health, job_start, failure,
// exclusion, restart, launch_end) and its accounting to RUN/goodput.json.
#pragma once

#include <string>
#include <vector>

#include "keel/resilience/health.h"
#include "keel/resilience/hosts.h"
#include "keel/resilience/launcher.h"

namespace keel::resilience {

struct LaunchPolicy {
  int max_restarts = 10;
  double backoff_s = 10, backoff_max_s = 300;
  int window_failures = 5;
  double window_minutes = 30;
  int host_failures = 2;
  double heartbeat_s = 5, heartbeat_timeout_s = 120;
  double health_timeout_s = 60;
  double stop_grace_s = 300;
  double regrow_minutes = 10;
};

// Tier-0 checkpoint holders ([checkpoint] peer_every): one `keel holder` per host of the job,
// started before it and kept across restarts (restarted where one died with its host).
struct HolderSpec {
  bool on = false;
  int port = 29790;
  double memory_gb = 0;   // 0: no limit
  std::string spill_dir;  // "" none; "{host}" in it becomes each host's name
  std::string keel;       // the binary
};

struct SupervisorSpec {
  Launcher launcher = Launcher::kLocal;
  std::vector<Host> hosts;
  int ranks_per_host = 1;
  LayoutRule layout;
  bool set_dp = false;     // pass [parallel] dp when it changes (the config names one)
  bool set_micro = false;  // pass train.micro_batch_size (the config leaves it to the rank count)
  std::string run_dir;
  std::vector<std::string> train_command;   // keel train CONFIG --set ... (no --resume)
  std::vector<std::string> health_command;  // keel health --json ...
  std::vector<std::string> launcher_args;
  LaunchPolicy policy;
  HolderSpec holders;
};

// Runs the job to its end; returns the supervisor's exit code: 0 finished (or stopped on
// request, with a checkpoint), 2 bad input, 1 gave up (the failure history is printed).
int Supervise(const SupervisorSpec& spec);

}  // namespace keel::resilience
