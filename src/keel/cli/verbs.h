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
// `keel ckpt export` and `keel ckpt import` (Hugging Face GPT-2 safetensors), added to the `keel
// ckpt` group that main() creates; the group's other verbs add themselves beside them.
void AddCkptInteropVerbs(CLI::App& ckpt);

}  // namespace keel::cli
