// keel preflight: a pressure test of the machines a run is about to use, under the same launcher
// as training (mpirun -np N keel preflight --config X.toml). Measures what the plan assumes —
// matrix-multiply rate, memory, checkpoint storage, the data path, all-reduce — and prints a
// go / no-go table with the reason for each line; exits non-zero on a no-go. The checks live in
// preflight_checks.cc; this file reads the request and prints the answer.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "keel/cli/preflight_checks.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/train/config.h"
#include "keel/train/memory_check.h"

namespace keel::cli {

namespace {

struct PreflightArgs {
  std::string config, model, data, dir;
  std::vector<std::string> set;  // "section.key=value", as keel train --set
  double node_mtbf_hours = 6000, efficiency = -1;
  bool quick = false, json = false;
};

std::string Clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

void PrintTable(const std::vector<preflight::Row>& rows, const preflight::Context& c,
                const std::string& verdict) {
  std::printf("keel preflight: %d rank(s) x %d thread(s), %s %s, micro-batch %d x %d tokens\n\n",
              c.comm->size(), c.threads, c.model_name.c_str(), DTypeName(c.dtype), c.micro_batch,
              c.seq);
  std::printf("%-16s %-7s %-64s %s\n", "check", "verdict", "measured", "expected");
  int counts[4] = {0, 0, 0, 0};
  for (const auto& r : rows) {
    std::printf("%-16s %-7s %-64s %s\n", r.check.c_str(), r.verdict.c_str(),
                Clip(r.measured, 64).c_str(), r.expected.c_str());
    if (!r.reason.empty()) std::printf("%-24s -> %s\n", "", r.reason.c_str());
    counts[r.verdict == "go" ? 0 : r.verdict == "warn" ? 1 : r.verdict == "no-go" ? 2 : 3]++;
  }
  std::printf("\nverdict: %s (%d go, %d warn, %d no-go, %d skipped)\n", verdict.c_str(), counts[0],
              counts[1], counts[2], counts[3]);
}

}  // namespace

void RegisterPreflight(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "preflight", "Pressure-test this machine (or every rank under mpirun) before a run");
  cmd->footer(
      "Examples:\n"
      "  keel preflight --quick                      (about 5 s; the default run takes < 30 s)\n"
      "  keel preflight --config configs/quickstart.toml --json\n"
      "  mpirun -np 4 keel preflight --config run.toml   (adds all-reduce and per-rank checks)\n"
      "Rows: software consistency, matmul bf16/fp32 vs the measured peak, a training step vs the\n"
      "plan's prediction, memory bandwidth, planned vs available memory, checkpoint\n"
      "write+fsync+read-back, data loader vs the step's need, all-reduce bus bandwidth.\n"
      "Exit code 1 on any no-go; see docs/PLAN.md.");
  static PreflightArgs a;
  cmd->add_option("--config", a.config, "the run's TOML (model, batch, data, run directory)");
  cmd->add_option("--model", a.model, "override [model] name (gpt2-tiny..gpt2-xl)");
  cmd->add_option("--set", a.set, "override a config key, e.g. --set data.seq_len=64");
  cmd->add_option("--data", a.data, "dataset to read (default: the config's [data] train)");
  cmd->add_option("--dir", a.dir, "checkpoint directory to test (default: RUN_DIR/checkpoints)");
  cmd->add_option("--node-mtbf-hours", a.node_mtbf_hours, "for the checkpoint interval")
      ->capture_default_str();
  cmd->add_option("--efficiency", a.efficiency,
                  "fraction of the measured peak the plan assumes (default: keel plan's for "
                  "this-cpu, 0.5 fp32, 0.095 bf16)");
  cmd->add_flag("--quick", a.quick, "short measurements (about 5 s)");
  cmd->add_flag("--json", a.json, "print JSON instead of a table");
  cmd->callback([] {
    char num[32];
    if (!(a.node_mtbf_hours > 0)) {
      std::snprintf(num, sizeof(num), "%g", a.node_mtbf_hours);
      ThrowBadInput(std::string("preflight: --node-mtbf-hours ") + num + ": expected > 0");
    }
    if (a.efficiency != -1 && !(a.efficiency > 0 && a.efficiency <= 1)) {
      std::snprintf(num, sizeof(num), "%g", a.efficiency);
      ThrowBadInput(std::string("preflight: --efficiency ") + num + ": expected in (0, 1]");
    }
    std::vector<std::string> overrides = a.set;
    if (!a.model.empty()) overrides.push_back("model.name=" + a.model);
    const train::RunConfig cfg = train::LoadConfig(a.config, overrides);
    auto comm = parallel::CreateComm();
    preflight::Context c;
    c.comm = comm.get();
    c.model = cfg.ResolvedModel();
    c.model_name = cfg.model.name;
    c.dtype = cfg.train.precision == "fp32" ? DType::kF32 : DType::kBF16;
    c.recompute = model::ParseRecompute(cfg.model.recompute);
    c.seq = cfg.data.seq_len;
    c.global_batch = cfg.train.batch_size;
    c.micro_batch = cfg.train.micro_batch_size > 0
                        ? cfg.train.micro_batch_size
                        : std::max(1, cfg.train.batch_size / comm->size());
    c.threads = omp_get_max_threads();
    c.bucket_bytes = double(cfg.parallel.bucket_mb) * (1 << 20);
    const std::string run_dir = cfg.train.out_dir + "/" + cfg.train.name;
    // Without a config there is no run directory: test the temporary directory instead.
    c.ckpt_dir = !a.dir.empty() ? a.dir
                 : !a.config.empty()
                     ? run_dir + "/checkpoints"
                     : (std::filesystem::temp_directory_path() / "keel-preflight").string();
    c.data_path = !a.data.empty()             ? a.data
                  : !cfg.data.train.empty()   ? cfg.data.train
                  : !cfg.data.sources.empty() ? cfg.data.sources[0].path
                                              : "";
    c.offload_dir = cfg.offload.dir;
    c.offload_chunk = cfg.offload.chunk_mib * 1048576;
    c.tiers = train::TiersOf(cfg);
    c.node_mtbf_hours = a.node_mtbf_hours;
    c.efficiency = a.efficiency;
    c.quick = a.quick;

    // The order matters: the data and all-reduce rows use the matmul and copy rates.
    std::vector<preflight::Row> rows;
    rows.push_back(preflight::CheckSoftware(c));
    rows.push_back(preflight::CheckMatmul(c, DType::kBF16));
    rows.push_back(preflight::CheckMatmul(c, DType::kF32));
    rows.push_back(preflight::CheckStep(c));
    rows.push_back(preflight::CheckMemoryBandwidth(c));
    rows.push_back(preflight::CheckMemory(c));
    rows.push_back(preflight::CheckCheckpoint(c));
    rows.push_back(preflight::CheckData(c));
    rows.push_back(preflight::CheckOffload(c));
    rows.push_back(preflight::CheckAllReduce(c));

    std::string nogo;
    for (const auto& r : rows)
      if (r.verdict == "no-go") nogo += (nogo.empty() ? "" : ", ") + r.check;
    const std::string verdict = nogo.empty() ? "GO" : "NO-GO";
    if (comm->rank() == 0) {
      nlohmann::json out = {{"verdict", nogo.empty() ? "go" : "no-go"},
                            {"ranks", comm->size()},
                            {"threads", c.threads},
                            {"model", c.model_name},
                            {"precision", DTypeName(c.dtype)},
                            {"rows", nlohmann::json::array()}};
      for (const auto& r : rows)
        out["rows"].push_back({{"check", r.check},
                               {"measured", r.measured},
                               {"expected", r.expected},
                               {"verdict", r.verdict},
                               {"reason", r.reason},
                               {"data", r.data}});
      if (a.json)
        std::printf("%s\n", out.dump(2).c_str());
      else
        PrintTable(rows, c, verdict);
      // Beside the run's other records, when there is a run (a config was given).
      if (!a.config.empty()) {
        std::filesystem::create_directories(run_dir);
        std::ofstream(run_dir + "/preflight.json") << out.dump(2) << "\n";
      }
    }
    if (!nogo.empty()) ThrowRuntime("preflight: no-go: " + nogo + " (see the table)");
  });
}

}  // namespace keel::cli
