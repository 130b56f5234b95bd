// The verbs of the `keel` command. Each lives in its own file and registers a CLI11 subcommand
// whose callback does the work; errors are thrown as keel::Error and turned into one line and an
// exit code by main().
#pragma once

#include <CLI/CLI.hpp>

namespace keel::cli {

void RegisterTrain(CLI::App& app);
void RegisterGenerate(CLI::App& app);
void RegisterEval(CLI::App& app);
void RegisterData(CLI::App& app);
void RegisterPlan(CLI::App& app);
void RegisterPreflight(CLI::App& app);
// keel launch (the supervisor) and keel health (its per-host check); launch.cc.
void RegisterLaunch(CLI::App& app);
// keel holder: a host's tier-0 checkpoint holder, which keel launch starts (holder.cc).
void RegisterHolder(CLI::App& app);
// keel dashboard (a live page for runs) and keel report (the same, one offline HTML file).
void RegisterDashboard(CLI::App& app);

}  // namespace keel::cli

namespace keel::plan {
struct Accelerator;
struct Job;
}  // namespace keel::plan

namespace keel::cli {

// This machine's CPUs as a planner accelerator, measured in well under 2 s (this_cpu.cc); used by
// `keel plan --accelerator this-cpu` and `keel preflight`.
plan::Accelerator MeasureThisCpu();
// Times keel's kernels on `job`'s model shapes (a fixed micro-batch, or 0: each rank's share of
// the global batch) and puts the rate in job.cluster.accel (Accelerator::measured_flops), from
// which plan::DefaultEfficiency follows (this_cpu.cc).
void MeasureKernels(plan::Job& job, int micro_batch);
// `keel ckpt export` and `keel ckpt import` (Hugging Face GPT-2 safetensors), added to the `keel
// ckpt` group that main() creates; the group's other verbs add themselves beside them.
void AddCkptInteropVerbs(CLI::App& ckpt);
// `keel ckpt list`, `verify` and `inspect` (ckpt_tools.cc).
void AddCkptToolVerbs(CLI::App& ckpt);

}  // namespace keel::cli
