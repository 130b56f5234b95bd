// keel: train GPT-style models and keep long runs alive. `keel help` lists the verbs.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/stop_signal.h"
#include "keel/kernels/cpu_isa.h"

int main(int argc, char** argv) {
  keel::InstallStopSignals();  // before any thread exists, so that every thread inherits the mask
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, which keel reports, rather than
  // the process being killed mid-line.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"keel: train GPT-style language models, from one CPU to a cluster", "keel"};
  app.require_subcommand(1);
  keel::cli::RegisterTrain(app);
  keel::cli::RegisterGenerate(app);
  keel::cli::RegisterEval(app);
  keel::cli::RegisterData(app);
  keel::cli::RegisterPlan(app);
  keel::cli::RegisterPreflight(app);
  keel::cli::RegisterLaunch(app);
  keel::cli::RegisterHolder(app);
  keel::cli::RegisterDashboard(app);
  auto* ckpt = app.add_subcommand(
      "ckpt", "Checkpoints and model files: list, verify, inspect, export, import");
  ckpt->require_subcommand(1);
  keel::cli::AddCkptToolVerbs(*ckpt);
  keel::cli::AddCkptInteropVerbs(*ckpt);
  auto* help = app.add_subcommand("help", "Explain a verb with an example: keel help train");
  std::string verb;
  help->add_option("verb", verb, "the verb to explain");
  help->callback([&] {
    if (verb.empty()) {
      // app.help() would describe the selected subcommand (this one), not the whole command.
      std::printf("%s",
                  app.get_formatter()->make_help(&app, "keel", CLI::AppFormatMode::Normal).c_str());
      return;
    }
    CLI::App* sub = nullptr;
    for (auto* s : app.get_subcommands({}))
      if (s->get_name() == verb) sub = s;
    if (!sub) keel::ThrowBadInput("help: unknown verb \"" + verb + "\" (try: keel help)");
    std::printf("%s", sub->help().c_str());
  });
  // CLI11 would say only "A subcommand is required" for a verb it does not know.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string verbs;
    for (auto* s : app.get_subcommands({})) {
      known = known || s->get_name() == argv[1];
      verbs += (verbs.empty() ? "" : ", ") + s->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "keel: error: unknown verb \"%s\" (known: %s; see keel help)\n", argv[1],
                   verbs.c_str());
      return int(keel::ExitCode::kBadInput);
    }
  }
  try {
    // KEEL_CPU_ISA is read once, here, so that a bad value is one line before any work or thread.
    keel::kernels::ChosenCpuIsa();
    keel::kernels::FlushDenormals();  // before any thread starts, so that all inherit it
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : int(keel::ExitCode::kBadInput);
  } catch (const keel::Error& e) {
    if (!e.quiet()) std::fprintf(stderr, "keel: error: %s\n", e.what());
    return int(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel: error: %s\n", e.what());
    return int(keel::ExitCode::kRuntime);
  }
  return 0;
}
