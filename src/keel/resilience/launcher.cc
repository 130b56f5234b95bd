#include "keel/resilience/launcher.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "keel/core/error.h"
#include "keel/resilience/process.h"

namespace keel::resilience {

Launcher ChooseLauncher(const std::string& name, bool have_hostfile) {
  if (name == "local") return Launcher::kLocal;
  if (name == "mpirun") return Launcher::kMpirun;
  if (name == "slurm") return Launcher::kSlurm;
  if (std::getenv("SLURM_JOB_ID")) return Launcher::kSlurm;
  return have_hostfile ? Launcher::kMpirun : Launcher::kLocal;
}

const char* LauncherName(Launcher l) {
  switch (l) {
    case Launcher::kLocal:
      return "local";
    case Launcher::kMpirun:
      return "mpirun";
    case Launcher::kSlurm:
      return "slurm";
  }
  return "?";
}

std::vector<Host> SlurmHosts() {
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (!list)
    ThrowBadInput(
        "keel launch --launcher slurm: not inside a Slurm allocation "
        "(no SLURM_JOB_NODELIST); run it from sbatch or salloc");
  std::string out;
  int status = 0;
  if (!RunCaptured({"scontrol", "show", "hostnames", list}, 30, &out, &status) ||
      ExitCodeOf(status) != 0)
    ThrowRuntime("scontrol show hostnames " + std::string(list) + " failed: " + out);
  std::vector<Host> hosts;
  std::istringstream in(out);
  const char* per = std::getenv("SLURM_NTASKS_PER_NODE");
  for (std::string name; in >> name;) {
    Host h;
    h.name = name;
    h.slots = per ? std::max(1, std::atoi(per)) : 1;
    hosts.push_back(h);
  }
  if (hosts.empty()) ThrowRuntime("the Slurm allocation " + std::string(list) + " has no hosts");
  return hosts;
}

namespace {

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

void AddMpirunCommon(const JobLine& job, std::vector<std::string>& a) {
  a.push_back("mpirun");
  if (::geteuid() == 0) a.push_back("--allow-run-as-root");
  // Without TCP keepalive on its links to the daemons, mpirun waits for a host whose link went
  // down until TCP gives up (about 15 minutes): with it, it exits (205) within ~11 s. Settings in
  // the environment win.
  if (job.launcher == Launcher::kMpirun && !std::getenv("OMPI_MCA_oob_tcp_keepalive_time"))
    a.insert(a.end(), {"--mca", "oob_tcp_keepalive_time", "5", "--mca", "oob_tcp_keepalive_intvl",
                       "2", "--mca", "oob_tcp_keepalive_probes", "3"});
  for (const auto& e : job.env) a.insert(a.end(), {"-x", e});
  // mpirun binds each rank to one core when it starts two or fewer (to a socket beyond): two hosts
  // of one rank each would train on one core apiece whatever they have, since OpenMP starts from
  // the CPUs a rank is bound to. Unbound, each rank takes its share of its host's cores
  // (cli/train.cc). A binding in launcher_args (--bind-to, or --map-by ...:PE=N, which binds
  // each rank to N cores) or Open MPI's environment wins.
  bool bound = std::getenv("OMPI_MCA_hwloc_base_binding_policy") != nullptr;
  for (const auto& x : job.launcher_args)
    bound = bound || x.rfind("--bind-to", 0) == 0 || x.find("PE=") != std::string::npos;
  if (!bound) a.insert(a.end(), {"--bind-to", "none"});
}

}  // namespace

std::vector<std::string> ForwardedEnv() {
  std::vector<std::string> out;
  // Not the paths (KEEL_ASSETS, KEEL_CACHE_DIR): another host's may differ.
  for (const char* v :
       {"OMP_NUM_THREADS", "KEEL_BUILD_TAG", "KEEL_CKPT_CRASH_AT", "KEEL_FAULT",
        "KEEL_OFFLOAD_CRASH_AT", "KEEL_CPU_ISA", "KEEL_BF16_PRODUCTS", "ONEDNN_MAX_CPU_ISA",
        "KEEL_TF32", "KEEL_FP8_EMULATE", "KEEL_CUDA_ATTENTION", "KEEL_COMM"})
    if (std::getenv(v)) out.push_back(v);
  return out;
}

std::vector<std::string> JobArgv(const JobLine& job, const std::vector<std::string>& command) {
  std::vector<std::string> a;
  switch (job.launcher) {
    case Launcher::kLocal:
      if (job.ranks == 1) return command;
      AddMpirunCommon(job, a);
      a.insert(a.end(), {"-np", std::to_string(job.ranks)});
      break;
    case Launcher::kMpirun: {
      AddMpirunCommon(job, a);
      std::vector<std::string> slots;
      for (const auto& h : job.hosts) slots.push_back(h + ":" + std::to_string(job.ranks_per_host));
      a.insert(a.end(), {"-np", std::to_string(job.ranks), "--host", Join(slots, ",")});
      break;
    }
    case Launcher::kSlurm:
      // --kill-on-bad-exit: one rank's death ends the step at once, as mpirun does.
      a = {"srun",
           "--nodes=" + std::to_string(job.hosts.size()),
           "--ntasks=" + std::to_string(job.ranks),
           "--ntasks-per-node=" + std::to_string(job.ranks_per_host),
           "--nodelist=" + Join(job.hosts, ","),
           "--kill-on-bad-exit=1"};
      break;
  }
  a.insert(a.end(), job.launcher_args.begin(), job.launcher_args.end());
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

std::vector<std::string> OnHostArgv(const JobLine& job, const std::string& host,
                                    const std::vector<std::string>& command) {
  std::vector<std::string> a;
  switch (job.launcher) {
    case Launcher::kLocal:
      return command;
    case Launcher::kMpirun:
      AddMpirunCommon(job, a);
      a.insert(a.end(), {"-np", "1", "--host", host});
      break;
    case Launcher::kSlurm:
      a = {"srun", "--nodes=1", "--ntasks=1", "--nodelist=" + host};
      break;
  }
  a.insert(a.end(), job.launcher_args.begin(), job.launcher_args.end());
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

std::vector<std::string> SplitArgs(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace keel::resilience
