// keel dashboard and keel report: see the charts of one or more runs, live or in one HTML file.
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/validate.h"
#include "keel/monitor/dashboard_server.h"
#include "keel/monitor/report.h"

namespace keel::cli {
namespace {

// A report replaces an earlier report, never another kind of file (RUN/model.safetensors,
// RUN/config.toml ...): one mistyped --out must not cost a run's weights.
void CheckOverwritesOnlyHtml(const std::string& what, const std::string& out) {
  std::error_code ec;
  if (!std::filesystem::exists(out, ec)) return;
  CheckRegularFile(out);
  std::ifstream in(out, std::ios::binary);
  std::string head(64, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  for (char& c : head) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (head.rfind("<!doctype html", 0) != 0 && head.rfind("<html", 0) != 0)
    ThrowBadInput(what + " " + out +
                  ": exists and is not an HTML report; refusing to overwrite it (pick a new path "
                  "or remove it)");
}

}  // namespace

void RegisterDashboard(CLI::App& app) {
  auto* dash = app.add_subcommand("dashboard", "Serve a live page of charts for runs");
  dash->footer(
      "Examples:\n"
      "  keel dashboard runs/quickstart                 # then open http://127.0.0.1:8800/\n"
      "  keel dashboard runs/lr1e-3 runs/lr3e-4         # overlay two runs\n"
      "  keel dashboard runs/big --addr 0.0.0.0 --token s3cret   # http://HOST:8800/?token=s3cret\n"
      "Loss, validation loss, learning rate, gradient norm, tokens/s, MFU, memory and the step\n"
      "time by phase, with checkpoints, restarts, rollbacks and alerts marked; the page updates\n"
      "while the runs train. Read-only; localhost unless --addr, which then needs --token.");
  static monitor::DashboardOptions d;
  dash->add_option("runs", d.runs, "run folders (runs/NAME)")->required();
  dash->add_option("--port", d.port, "port (0: any free one, printed)")->capture_default_str();
  dash->add_option("--addr", d.addr, "address to listen on")->capture_default_str();
  dash->add_option("--token", d.token, "required of every request (?token= or a Bearer header)");
  dash->add_option("--poll-ms", d.poll_ms, "how often the page asks for new lines")
      ->capture_default_str();
  dash->callback([] {
    CheckRange("keel dashboard --port", d.port, 0, 65535);
    CheckRange("keel dashboard --poll-ms", d.poll_ms, 100, 3600e3);
    monitor::ServeDashboard(d);
  });

  auto* rep = app.add_subcommand("report", "Write one self-contained HTML report of runs");
  rep->footer(
      "Examples:\n"
      "  keel report runs/quickstart                       # runs/quickstart/report.html\n"
      "  keel report runs/a runs/b --out ab.html --png plots/\n"
      "A summary table (steps, tokens, time, goodput, final and best validation loss, median\n"
      "MFU, events) and the dashboard's charts, with the data and Chart.js inlined: it opens\n"
      "offline. --png renders each chart with headless Chromium where it is installed.");
  static std::vector<std::string> runs;
  static std::string out, png;
  static int width = 1000, height = 520;
  rep->add_option("runs", runs, "run folders (runs/NAME)")->required();
  rep->add_option("--out", out, "the HTML file (default: the first run's report.html)");
  rep->add_option("--png", png, "also render each chart to DIR/CHART.png");
  rep->add_option("--png-size", width, "PNG width in pixels")->capture_default_str();
  rep->callback([] {
    CheckRange("keel report --png-size", width, 100, 10000);
    const std::string file = out.empty() ? runs[0] + "/report.html" : out;
    std::vector<std::string> inputs;
    for (const std::string& r : runs)
      for (const char* f : {"metrics.jsonl", "events.jsonl", "goodput.json"})
        inputs.push_back(r + "/" + f);
    CheckNotAnInput("keel report --out", file, inputs);
    CheckOverwritesOnlyHtml("keel report --out", file);
    const std::vector<std::string> charts = monitor::WriteReport(runs, file);
    std::printf("keel report: wrote %s (%zu run(s), %zu charts)\n", file.c_str(), runs.size(),
                charts.size());
    if (!png.empty()) monitor::RenderPngs(file, charts, png, width, height);
  });
}

}  // namespace keel::cli
