// The verbs of the `keel` command. Each lives in its own file and registers a CLI11 subcommand
// whose callback does the work; errors are thrown as keel::Error and turned into one line and an
// exit code by main().
#pragma once

#include <CLI/CLI.hpp>

namespace keel::cli {

void RegisterTrain(CLI::App& app);
void RegisterGenerate(CLI::App& app);
void RegisterData(CLI::App& app);
void RegisterPlan(CLI::App& app);
void RegisterPreflight(CLI::App& app);

}  // namespace keel::cli

namespace keel::plan {
struct Accelerator;
}

namespace keel::cli {

// This machine's CPUs as a planner accelerator, measured in well under 2 s (plan.cc); used by
// `keel plan --accelerator this-cpu` and `keel preflight`.
plan::Accelerator MeasureThisCpu();
// `keel ckpt export` and `keel ckpt import` (Hugging Face GPT-2 safetensors), added to the `keel
// ckpt` group that main() creates; the group's other verbs add themselves beside them.
void AddCkptInteropVerbs(CLI::App& ckpt);
// `keel ckpt list`, `verify` and `inspect` (ckpt_tools.cc).
void AddCkptToolVerbs(CLI::App& ckpt);

}  // namespace keel::cli
