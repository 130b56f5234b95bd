// keel launch: run a training job under the supervisor (resilience/supervisor.h), and keel health,
// the per-host check the supervisor runs before every start.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/host.h"
#include "keel/core/validate.h"
#include "keel/data/http_fetch.h"
#include "keel/monitor/prometheus_exporter.h"
#include "keel/resilience/health.h"
#include "keel/resilience/supervisor.h"
#include "keel/train/config.h"
#include "keel/train/run_setup.h"

namespace keel::cli {
namespace {

std::string SelfExe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "keel";
}

std::vector<std::string> DataPaths(const train::RunConfig& cfg) {
  std::vector<std::string> paths;
  if (!cfg.data.train.empty()) paths.push_back(cfg.data.train);
  for (const auto& src : cfg.data.sources) paths.push_back(src.path);
  if (!cfg.data.val.empty()) paths.push_back(cfg.data.val);
  return paths;
}

void RegisterHealth(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "health", "Check this host for keel launch: a matrix product, memory, disk, the build");
  cmd->footer(
      "Prints one JSON line; exit 0 when the host is fit to run a job, 1 otherwise.\n"
      "keel launch runs it on every host (through mpirun or srun) before each start.\n"
      "Example:\n"
      "  keel health --dir runs/big/checkpoints --min-free-gb 50\n"
      "  keel health --device cuda      # loads the CUDA plugin; one line and exit 2 if it cannot");
  static resilience::HealthOptions o;
  cmd->add_option("--dir", o.disk_dir, "the checkpoint folder whose free space is checked");
  cmd->add_option("--min-free-gb", o.min_free_disk_gb, "free disk needed there (GB)");
  cmd->add_option("--min-free-mem-gb", o.min_free_mem_gb, "free memory needed (GB; 0 = any)");
  cmd->add_option("--min-gflops", o.min_gflops, "slowest acceptable fp32 product (0 = any)");
  static std::string device = "cpu";
  cmd->add_option("--device", device, "where the product runs: cpu or cuda (loads the plugin)");
  cmd->callback([] {
    if (!kernels::ParseDevice(device, &o.device))
      ThrowBadInput("keel health --device: expected cpu or cuda, got \"" + device + "\"");
    CheckRange("keel health --min-free-gb", o.min_free_disk_gb, 0, 1e9);
    CheckRange("keel health --min-free-mem-gb", o.min_free_mem_gb, 0, 1e9);
    CheckRange("keel health --min-gflops", o.min_gflops, 0, 1e12);
    const nlohmann::json r = resilience::CheckThisHost(o);
    std::printf("%s\n", r.dump().c_str());
    std::fflush(stdout);
    if (!r["ok"].get<bool>()) throw Error(ExitCode::kRuntime, "", /*quiet=*/true);
  });
}

}  // namespace

void RegisterLaunch(CLI::App& app) {
  RegisterHealth(app);
  auto* cmd = app.add_subcommand(
      "launch", "Run keel train under a supervisor that restarts it after failures");
  cmd->footer(
      "Starts the job (mpirun with a hostfile, srun inside a Slurm allocation, or this machine),\n"
      "watches each rank's heartbeat, and after a failure worth restarting (exit 75, a crash, a\n"
      "signal, a silent rank) stops what is left, checks every host's health, excludes hosts\n"
      "that failed, and resumes from the newest checkpoint: on a spare host when one is listed,\n"
      "or on fewer data-parallel ranks. Bad input (exit 2) is never retried. Ctrl-C or SIGTERM\n"
      "asks the job to save and stop. The policy is [launch] in the config (docs/CONFIG.md);\n"
      "events go to RUN/events.jsonl and the accounting to RUN/goodput.json.\n"
      "Examples:\n"
      "  keel launch configs/quickstart.toml --np 2                   # this machine, 2 ranks\n"
      "  keel launch configs/quickstart.toml --hostfile hosts --set launch.spares=node9\n"
      "  sbatch examples/slurm_launch.sbatch                          # inside Slurm: srun\n"
      "Exit codes: 0 finished (or stopped with a checkpoint), 2 bad input, 1 gave up.");
  static std::string config;
  static std::vector<std::string> overrides;
  static std::string hostfile, launcher;
  static int np = 0;
  cmd->add_option("config", config, "the run's TOML file");
  cmd->add_option("--set", overrides, "override a key: section.key=value (repeatable)");
  cmd->add_option("--hostfile", hostfile, "OpenMPI hostfile; same as --set launch.hostfile=...");
  cmd->add_option("--launcher", launcher, "auto, local, mpirun or slurm ([launch] launcher)");
  auto* np_opt = cmd->add_option(
      "--np", np, "ranks per host ([launch] ranks_per_host); on this machine: ranks");
  cmd->callback([np_opt] {
    if (np_opt->count() > 0) CheckRange("keel launch --np", np, 1, 4096);
    std::vector<std::string> sets = overrides;
    if (!hostfile.empty()) sets.push_back("launch.hostfile=" + hostfile);
    if (!launcher.empty()) sets.push_back("launch.launcher=" + launcher);
    if (np > 0) sets.push_back("launch.ranks_per_host=" + std::to_string(np));
    const train::RunConfig cfg = train::LoadConfig(config, sets);
    const train::LaunchSection& l = cfg.launch;

    resilience::SupervisorSpec spec;
    spec.launcher = resilience::ChooseLauncher(l.launcher, !l.hostfile.empty());
    if (spec.launcher == resilience::Launcher::kSlurm) {
      spec.hosts = resilience::SlurmHosts();
    } else if (spec.launcher == resilience::Launcher::kMpirun) {
      if (l.hostfile.empty())
        ThrowBadInput("keel launch --launcher mpirun: expected --hostfile (or [launch] hostfile)");
      spec.hosts = resilience::ReadHostfile(l.hostfile);
    } else {
      if (!l.hostfile.empty())
        ThrowBadInput("keel launch: a hostfile needs --launcher mpirun (or auto), not local");
      spec.hosts.emplace_back();
      spec.hosts.back().name = HostName();
    }
    resilience::MarkSpares(spec.hosts, l.spares);
    int slots = INT_MAX;
    for (const auto& h : spec.hosts) slots = std::min(slots, h.slots);
    spec.ranks_per_host = l.ranks_per_host > 0                            ? l.ranks_per_host
                          : spec.launcher == resilience::Launcher::kLocal ? 1
                                                                          : slots;
    int active = 0;
    for (const auto& h : spec.hosts) active += h.spare ? 0 : 1;
    if (active == 0) ThrowBadInput("[launch] spares: every host is a spare; none would train");

    const int ranks = active * spec.ranks_per_host;
    // What keel train would refuse (the layout, the data, KEEL_FAULT) is refused here, before the
    // supervisor writes the run folder. The data is opened where the ranks will see it as this
    // host does: on this machine, or on hosts that share its files.
    bool data_here = true;
    for (const std::string& p : DataPaths(cfg))
      data_here = data_here && (data::IsHttpUrl(p) || std::filesystem::exists(p));
    train::CheckRunInput(cfg, ranks, spec.launcher == resilience::Launcher::kLocal || data_here);
    if (spec.launcher == resilience::Launcher::kLocal && cfg.monitor.metrics_port > 0)
      monitor::MetricsExporter(cfg.monitor.metrics_addr, cfg.monitor.metrics_port,
                               cfg.monitor.metrics_token);  // in use?
    spec.layout.tp = cfg.parallel.tp;
    spec.layout.pp = cfg.parallel.pp;
    spec.layout.cp = cfg.parallel.cp;
    spec.layout.batch = cfg.train.batch_size;
    // The layout at full size is the trainer's to judge (one message, from the ranks); the
    // supervisor only needs its per-rank micro-batch, kept when the job shrinks.
    const int dp = std::max(
        1, cfg.parallel.dp > 0 ? cfg.parallel.dp : ranks / std::max(1, spec.layout.model()));
    spec.set_micro = cfg.train.micro_batch_size == 0;
    spec.layout.micro = cfg.train.micro_batch_size > 0 ? cfg.train.micro_batch_size
                                                       : std::max(1, cfg.train.batch_size / dp);
    spec.set_dp = cfg.parallel.dp > 0;
    spec.run_dir = (std::filesystem::path(cfg.train.out_dir) / cfg.train.name).string();
    const std::string ckpt_dir =
        cfg.checkpoint.dir.empty() ? spec.run_dir + "/checkpoints" : cfg.checkpoint.dir;
    const std::string self = SelfExe();
    spec.train_command = {self, "train"};
    if (!config.empty()) spec.train_command.push_back(std::filesystem::absolute(config).string());
    for (const auto& s : overrides)
      spec.train_command.insert(spec.train_command.end(), {"--set", s});
    spec.holders.on = cfg.checkpoint.peer_every > 0;
    spec.holders.port = l.holder_port;
    spec.holders.memory_gb = l.holder_memory_gb;
    spec.holders.spill_dir = l.holder_spill_dir;
    spec.holders.keel = self;
    spec.health_command = {self,
                           "health",
                           "--dir",
                           std::filesystem::absolute(ckpt_dir).string(),
                           "--min-free-gb",
                           std::to_string(l.health_min_free_gb),
                           "--min-gflops",
                           std::to_string(l.health_min_gflops),
                           "--device",
                           cfg.train.device};  // a GPU run checks each host's GPU
    spec.launcher_args = resilience::SplitArgs(l.launcher_args);
    resilience::LaunchPolicy& p = spec.policy;
    p.max_restarts = l.max_restarts;
    p.backoff_s = l.backoff_s;
    p.backoff_max_s = l.backoff_max_s;
    p.window_failures = l.window_failures;
    p.window_minutes = l.window_minutes;
    p.host_failures = l.host_failures;
    p.heartbeat_s = l.heartbeat_s;
    p.heartbeat_timeout_s = l.heartbeat_timeout_s;
    p.health_timeout_s = l.health_timeout_s;
    p.stop_grace_s = l.stop_grace_s;
    p.regrow_minutes = l.regrow_minutes;
    const int rc = resilience::Supervise(spec);
    if (rc != 0) throw Error(ExitCode(rc), "", /*quiet=*/true);
  });
}

}  // namespace keel::cli
