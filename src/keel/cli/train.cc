// keel train: run a training job from a TOML config.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/parallel/comm.h"
#include "keel/train/config.h"
#include "keel/train/rank_agreement.h"
#include "keel/train/trainer.h"

namespace keel::cli {
namespace {

// Ranks that share a machine split its cores, unless the user chose a thread count.
void SplitCoresAmongLocalRanks() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int n = local ? std::atoi(local) : 1;
  const int cores = int(std::thread::hardware_concurrency());
  const int share = cores / std::max(1, n);
  // OpenMP starts from the CPUs the launcher bound this rank to: mpirun binds each rank to one
  // core when it starts two or fewer, so `mpirun -np 2` on a 16-core host trains on 2 of them.
  // Said once per host; keel launch passes --bind-to none.
  cpu_set_t set;
  const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local && local_rank && std::atoi(local_rank) == 0 &&
      ::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < share)
    Log("keel: the launcher bound each rank to %d CPU(s) of this host's %d: %d thread(s) a rank "
        "(mpirun binds to a core when it starts 2 ranks or fewer; `mpirun --bind-to none`, as "
        "keel launch does, lets the %d rank(s) here share all of them)",
        CPU_COUNT(&set), cores, CPU_COUNT(&set), n);
  if (std::getenv("OMP_NUM_THREADS")) return;
  // Unbound ranks split the cores: two with all of them each would oversubscribe them and spin
  // in each other's OpenMP barriers.
  if (n > 1) omp_set_num_threads(std::max(1, std::min(omp_get_max_threads(), share)));
}

}  // namespace

void RegisterTrain(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a GPT model from a TOML config");
  cmd->footer(
      "Examples:\n"
      "  keel train configs/quickstart.toml\n"
      "  keel train configs/quickstart.toml --set optim.lr=3e-4 --set train.steps=50\n"
      "  mpirun -np 2 keel train configs/quickstart.toml     # data parallel over 2 processes\n"
      "  keel train configs/quickstart.toml --resume auto    # continue from the newest good "
      "checkpoint\n"
      "Every key is in docs/CONFIG.md. The run directory (train.out_dir/train.name) gets\n"
      "config.toml, metrics.jsonl, events.jsonl, checkpoints/ ([checkpoint] says when) and, at\n"
      "the end or on Ctrl-C, model.safetensors.");
  static std::string config;
  static std::vector<std::string> overrides;
  cmd->add_option("config", config, "the run's TOML file (omit for defaults)");
  cmd->add_option("--set", overrides, "override a key: section.key=value (repeatable)");
  static std::string resume;
  cmd->add_option("--resume", resume,
                  "auto (the newest checkpoint that verifies, or a fresh start if there is none) "
                  "or a checkpoint folder; same as --set checkpoint.resume=...");
  cmd->callback([] {
    if (!resume.empty()) overrides.push_back("checkpoint.resume=" + resume);
    SplitCoresAmongLocalRanks();
    auto comm = parallel::CreateComm();
    if (comm->size() > 1) SetLogRank(comm->rank());
    // A config error is the job's, said once: every rank reads the config, and the lowest rank
    // that fails speaks for all (naming itself when it is not rank 0).
    std::optional<train::RunConfig> loaded;
    std::optional<Error> bad;
    try {
      loaded = train::LoadConfig(config, overrides);
    } catch (const Error& e) {
      bad = e;
    }
    train::ShareError(*comm, bad);
    const train::RunConfig& cfg = *loaded;
    train::TrainSummary s = train::Train(cfg, *comm);
    if (comm->rank() != 0) return;
    if (s.nothing_left) {
      std::printf(
          "run %s: already trained to step %d of train.steps = %d (%s); nothing left to "
          "train: raise train.steps to continue it\n",
          s.run_dir.c_str(), s.steps_done, cfg.train.steps, s.resumed_from.c_str());
      return;
    }
    std::printf("\nrun %s: %d steps, final train loss %.4f", s.run_dir.c_str(), s.steps_done,
                s.last_loss);
    if (s.val_loss) std::printf(", validation loss %.4f", *s.val_loss);
    std::printf(" (unigram entropy of the data: %.4f nats/token)\n", s.unigram_entropy);
    // The run's config.toml holds every key as this run resolved it, --set flags included.
    if (s.interrupted)
      std::printf(
          "interrupted at step %d; continue with: %skeel train %s/config.toml --resume "
          "auto\n",
          s.steps_done,
          comm->size() > 1 ? ("mpirun -np " + std::to_string(comm->size()) + " ").c_str() : "",
          s.run_dir.c_str());
  });
}

}  // namespace keel::cli
