// keel train: run a training job from a TOML config.
#include <cstdio>

#include "keel/cli/verbs.h"
#include "keel/core/log.h"
#include "keel/dist/comm.h"
#include "keel/train/config.h"
#include "keel/train/trainer.h"

namespace keel::cli {

void RegisterTrain(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a GPT model from a TOML config");
  cmd->footer(
      "Examples:\n"
      "  keel train configs/quickstart.toml\n"
      "  keel train configs/quickstart.toml --set optim.lr=3e-4 --set train.steps=50\n"
      "  mpirun -np 2 keel train configs/quickstart.toml     # data parallel over 2 processes\n"
      "Every key is in docs/CONFIG.md. The run directory (train.out_dir/train.name) gets\n"
      "config.toml, metrics.jsonl and, at the end or on Ctrl-C, model.safetensors.");
  static std::string config;
  static std::vector<std::string> overrides;
  cmd->add_option("config", config, "the run's TOML file (omit for defaults)");
  cmd->add_option("--set", overrides, "override a key: section.key=value (repeatable)");
  cmd->callback([] {
    auto cfg = train::LoadConfig(config, overrides);
    auto comm = dist::CreateComm();
    if (comm->size() > 1) SetLogRank(comm->rank());
    train::TrainSummary s = train::Train(cfg, *comm);
    if (comm->rank() != 0) return;
    std::printf("\nrun %s: %d steps, final train loss %.4f", s.run_dir.c_str(), s.steps_done,
                s.last_loss);
    if (s.val_loss >= 0) std::printf(", validation loss %.4f", s.val_loss);
    std::printf(" (unigram entropy of the data: %.4f nats/token)\n", s.unigram_entropy);
    if (s.interrupted)
      std::printf("interrupted; the model so far is in %s/model.safetensors\n", s.run_dir.c_str());
  });
}

}  // namespace keel::cli
