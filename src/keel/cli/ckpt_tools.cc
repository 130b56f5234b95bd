// keel ckpt list | verify | inspect: what a run's checkpoints are, whether each one would load,
// and what one holds.
#include <cstdio>
#include <filesystem>
#include <string>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/reader.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"

namespace keel::cli {
namespace {
namespace fs = std::filesystem;

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// The folders `keel ckpt list/verify` look at: one checkpoint, or every step_N and leftover .tmp
// folder of a run (or of a checkpoints folder), oldest first.
struct Target {
  std::string root;
  std::vector<std::string> dirs;  // checkpoint folders
  std::vector<std::string> tmp;   // step_N.tmp left by a crash or a save in flight
};

Target Resolve(const std::string& path) {
  if (!fs::exists(path)) ThrowBadInput(path + ": no such run or checkpoint folder");
  Target t;
  if (fs::exists(fs::path(path) / "manifest.json") || fs::exists(fs::path(path) / "COMMIT") ||
      ckpt::ParseStepDirName(fs::path(path).filename().string())) {
    t.root = fs::path(path).parent_path().string();
    t.dirs.push_back(path);
    return t;
  }
  t.root = ckpt::CheckpointRoot(path);
  for (const auto& d : ckpt::ListStepDirs(t.root)) t.dirs.push_back(d.path);
  for (const auto& d : ckpt::ListTmpDirs(t.root)) t.tmp.push_back(d.path);
  if (t.dirs.empty() && t.tmp.empty())
    ThrowBadInput(path + ": no checkpoints (expected a run folder, its checkpoints/ or a step_N)");
  return t;
}

void AddList(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("list", "A run's checkpoints: step, tokens, size, status");
  cmd->footer(
      "Status: committed (COMMIT matches the manifest and every piece's xxh3 verifies),\n"
      "incomplete (no COMMIT: being written, or cut by a crash), corrupt (anything else).\n"
      "--quick checks COMMIT and the manifest only, not the bytes.\n"
      "Example:\n  keel ckpt list runs/quickstart");
  static std::string run;
  static bool quick = false;
  cmd->add_option("run", run, "run folder, its checkpoints/ folder, or one step_N")->required();
  cmd->add_flag("--quick", quick, "skip hashing the data");
  cmd->callback([] {
    Target t = Resolve(run);
    const std::string latest = ckpt::ReadLatest(t.root);
    std::printf("%-22s %10s %14s %12s  %s\n", "checkpoint", "step", "tokens", "size", "status");
    for (const auto& dir : t.dirs) {
      ckpt::VerifyResult v;
      if (quick) {
        try {
          auto r = ckpt::CheckpointReader::Open(dir);
          v.step = r.manifest().step;
          v.tokens = r.manifest().tokens;
          v.bytes = r.manifest().TotalBytes();
          v.status = "committed (not hashed)";
        } catch (const Error& e) {
          v.status = fs::exists(dir + "/COMMIT") ? "corrupt" : "incomplete";
          v.problem = e.what();
        }
      } else {
        v = ckpt::Verify(dir);
      }
      const std::string name = fs::path(dir).filename().string();
      std::printf("%-22s %10lld %14llu %12s  %s%s\n", name.c_str(), static_cast<long long>(v.step),
                  static_cast<unsigned long long>(v.tokens), Mib(v.bytes).c_str(), v.status.c_str(),
                  name == latest ? "  <- latest" : "");
      if (!v.problem.empty()) std::printf("%24s%s\n", "", v.problem.c_str());
    }
    for (const auto& dir : t.tmp)
      std::printf("%-22s %10s %14s %12s  %s\n", fs::path(dir).filename().string().c_str(), "-", "-",
                  "-", "incomplete (never loaded)");
  });
}

void AddVerify(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("verify", "Check COMMIT, the manifest and every piece's xxh3");
  cmd->footer(
      "Exit status 0 when every checkpoint checked is committed and intact, 2 otherwise.\n"
      "For a run, its step_N folders are checked; .tmp folders (saves cut short) are listed\n"
      "but never loaded, so they do not fail the check.\n"
      "Examples:\n  keel ckpt verify runs/quickstart\n"
      "  keel ckpt verify runs/quickstart/checkpoints/step_00000300");
  static std::string path;
  cmd->add_option("path", path, "run folder, its checkpoints/ folder, or one step_N")->required();
  cmd->callback([] {
    Target t = Resolve(path);
    int bad = 0;
    std::printf("%-22s %10s %8s %8s %12s  %s\n", "checkpoint", "step", "tensors", "pieces", "size",
                "result");
    for (const auto& dir : t.dirs) {
      ckpt::VerifyResult v = ckpt::Verify(dir, /*progress=*/true);
      const bool ok = v.status == "committed";
      bad += !ok;
      std::printf("%-22s %10lld %8zu %8zu %12s  %s\n", fs::path(dir).filename().string().c_str(),
                  static_cast<long long>(v.step), v.tensors, v.pieces, Mib(v.bytes).c_str(),
                  ok ? "ok" : v.status.c_str());
      if (!v.bad.empty()) {
        for (const auto& b : v.bad)
          std::printf("    %s (%s) in %s bytes [%llu, %llu): %s\n", b.tensor.c_str(),
                      b.kind.c_str(), b.file.c_str(), static_cast<unsigned long long>(b.offset),
                      static_cast<unsigned long long>(b.offset + b.bytes), b.problem.c_str());
      } else if (!ok) {
        std::printf("    %s\n", v.problem.c_str());
      }
    }
    for (const auto& dir : t.tmp)
      std::printf("%-22s %10s %8s %8s %12s  %s\n", fs::path(dir).filename().string().c_str(), "-",
                  "-", "-", "-", "incomplete, ignored");
    if (bad)
      throw Error(ExitCode::kBadInput, std::to_string(bad) + " of " +
                                           std::to_string(t.dirs.size()) +
                                           " checkpoint(s) failed verification (see above)");
    std::printf("all %zu checkpoint(s) verified\n", t.dirs.size());
  });
}

void AddInspect(CLI::App& ckpt) {
  auto* cmd =
      ckpt.add_subcommand("inspect", "What a checkpoint holds: step, tokens, layout, state");
  cmd->footer("Example:\n  keel ckpt inspect runs/quickstart/checkpoints/step_00000300");
  static std::string dir;
  static bool all = false;
  cmd->add_option("dir", dir, "a checkpoint folder (step_N), or a run (its newest checkpoint)")
      ->required();
  cmd->add_flag("--tensors", all, "list every tensor (default: the first few and totals)");
  cmd->callback([] {
    Target t = Resolve(dir);
    if (t.dirs.empty()) ThrowBadInput(dir + ": no committed checkpoint");
    const std::string path = t.dirs.back();
    auto r = ckpt::CheckpointReader::Open(path);
    const ckpt::Manifest& m = r.manifest();
    const auto& s = m.state;
    std::printf("checkpoint  %s\n", path.c_str());
    std::printf("step        %lld\ntokens      %llu\n", static_cast<long long>(m.step),
                static_cast<unsigned long long>(m.tokens));
    auto show = [&](const char* label, const char* key) {
      if (s.contains(key)) std::printf("%-11s %s\n", label, s.at(key).dump().c_str());
    };
    show("layout", "layout");
    show("model", "model");
    show("precision", "precision");
    show("optimizer", "optimizer");
    show("scheduler", "scheduler");
    show("loader", "loader");
    show("rng", "rng");
    show("loss_scaler", "loss_scaler");
    uint64_t pieces = 0;
    for (const auto& e : m.tensors) pieces += e.pieces.size();
    std::printf("tensors     %zu (%llu pieces, %s)\n\n", m.tensors.size(),
                static_cast<unsigned long long>(pieces), Mib(m.TotalBytes()).c_str());
    std::printf("  %-32s %-7s %-16s %6s\n", "name", "kind", "shape", "pieces");
    size_t shown = 0;
    for (const auto& e : m.tensors) {
      if (!all && shown == 12) {
        std::printf("  ... %zu more (--tensors lists them all)\n", m.tensors.size() - shown);
        break;
      }
      std::string shape;
      for (size_t i = 0; i < e.shape.size(); ++i) {
        if (i) shape += 'x';
        shape += std::to_string(e.shape[i]);
      }
      std::printf("  %-32s %-7s %-16s %6zu\n", e.name.c_str(), e.kind.c_str(), shape.c_str(),
                  e.pieces.size());
      ++shown;
    }
  });
}

}  // namespace

void AddCkptToolVerbs(CLI::App& ckpt) {
  AddList(ckpt);
  AddVerify(ckpt);
  AddInspect(ckpt);
}

}  // namespace keel::cli
