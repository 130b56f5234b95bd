// How the supervisor starts things on hosts: the whole job (mpirun with the hosts it places, srun
// inside a Slurm allocation, or the local machine) and one command on one host (the health check).
#pragma once

#include <string>
#include <vector>

#include "keel/resilience/hosts.h"

namespace keel::resilience {

enum class Launcher { kLocal, kMpirun, kSlurm };

// "auto": slurm inside an allocation ($SLURM_JOB_ID), mpirun with a hostfile, else local.
Launcher ChooseLauncher(const std::string& name, bool have_hostfile);
const char* LauncherName(Launcher l);
// The hosts of the Slurm allocation (scontrol show hostnames $SLURM_JOB_NODELIST), with
// $SLURM_NTASKS_PER_NODE slots when set. Throws keel::Error when not inside one.
std::vector<Host> SlurmHosts();

struct JobLine {
  Launcher launcher = Launcher::kLocal;
  std::vector<std::string> hosts;
  int ranks_per_host = 1;
  int ranks = 1;
  std::vector<std::string> launcher_args;  // extra, from [launch] launcher_args
  std::vector<std::string> env;            // variables the ranks need, forwarded by name
};

// The variables of this environment, among those a rank reads, that are set: what a job's ranks
// on other hosts are given by name (mpirun -x; a local job inherits them anyway): threads, the
// fault drills (a KEEL_FAULT aimed at a remote rank would otherwise never fire, and the drill
// would pass), and the kernel and transport choices (replicas computing differently would fail
// the silent-corruption check).
std::vector<std::string> ForwardedEnv();

// The argv that runs `command` as the job.
std::vector<std::string> JobArgv(const JobLine& job, const std::vector<std::string>& command);
// The argv that runs `command` once on `host`.
std::vector<std::string> OnHostArgv(const JobLine& job, const std::string& host,
                                    const std::vector<std::string>& command);
// Splits [launch] launcher_args at spaces.
std::vector<std::string> SplitArgs(const std::string& s);

}  // namespace keel::resilience
