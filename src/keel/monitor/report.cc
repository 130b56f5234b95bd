#include "keel/monitor/report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "keel/core/error.h"
#include "keel/monitor/dashboard_page.h"
#include "keel/monitor/dashboard_server.h"
#include "keel/monitor/run_files.h"

namespace keel::monitor {
namespace {

nlohmann::json AllLines(const std::string& path, size_t* skipped) {
  nlohmann::json out = nlohmann::json::array();
  uint64_t at = 0;
  size_t here = 0;  // this file's skipped lines
  for (;;) {
    const LinesRead r = ReadLinesFrom(path, at);
    if (r.reset) {  // rewritten while read: its lines again
      out = nlohmann::json::array();
      here = 0;
    }
    here += r.skipped;
    for (nlohmann::json& j : ParseJsonLines(r.lines, &here)) out.push_back(std::move(j));
    if (r.next == at) {
      *skipped += here;
      return out;
    }
    at = r.next;
  }
}

std::string FindChromium() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string d;
  while (std::getline(dirs, d, ':'))
    for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
      if (access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return "";
}

}  // namespace

std::vector<std::string> WriteReport(const std::vector<std::string>& runs, const std::string& out) {
  if (runs.empty()) ThrowBadInput("keel report: expected at least one run folder");
  nlohmann::json list = nlohmann::json::array();
  std::string title = "keel report:";
  std::vector<std::string> charts = {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory"};
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string name = CheckRunDir(runs[i]);
    title += " " + name;
    size_t skipped = 0;
    list.push_back({{"name", name},
                    {"metrics", AllLines(runs[i] + "/metrics.jsonl", &skipped)},
                    {"events", AllLines(runs[i] + "/events.jsonl", &skipped)},
                    {"summary", RunSummary(runs[i])}});
    list.back()["skipped"] = skipped;
    if (skipped)
      std::fprintf(stderr, "keel report: %s: %zu line(s) skipped (not JSON, or over 1 MiB)\n",
                   runs[i].c_str(), skipped);
    charts.push_back(runs.size() > 1 ? "breakdown-" + std::to_string(i) : "breakdown");
  }
  std::ifstream in(ChartJsPath());
  std::stringstream js;
  js << in.rdbuf();
  const std::string page = DashboardHtml(title, "<script>\n" + ScriptSafe(js.str()) + "\n</script>",
                                         {{"mode", "static"}, {"runs", list}});
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << page;
    if (!(f.flush()))
      ThrowRuntime("keel report: cannot write " + tmp + " (" + std::strerror(errno) + ")");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec) ThrowRuntime("keel report: cannot write " + out + ": " + ec.message());
  return charts;
}

void RenderPngs(const std::string& html, const std::vector<std::string>& charts,
                const std::string& dir, int width, int height) {
  const std::string chromium = FindChromium();
  if (chromium.empty())
    ThrowRuntime(
        "keel report --png: no headless Chromium found (apt-get install chromium); the "
        "HTML report is written, the PNGs are not");
  std::filesystem::create_directories(dir);
  const std::string url = "file://" + std::filesystem::absolute(html).string();
  for (const std::string& id : charts) {
    const std::string png = dir + "/" + id + ".png";
    std::filesystem::remove(png);
    const std::string profile = dir + "/.chromium-profile";
    std::vector<std::string> args = {
        chromium,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--hide-scrollbars",
        "--no-first-run",
        "--user-data-dir=" + profile,
        "--virtual-time-budget=3000",
        "--window-size=" + std::to_string(width) + "," + std::to_string(height),
        "--screenshot=" + png,
        url + "#only=" + id};
    std::fflush(nullptr);  // else the child would flush this process's buffered lines again
    const pid_t pid = fork();
    if (pid == 0) {
      // Chromium's chatter (GPU and D-Bus notices) is not the user's business.
      (void)!freopen("/dev/null", "w", stdout);
      (void)!freopen("/dev/null", "w", stderr);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!std::filesystem::exists(png))
      ThrowRuntime("keel report --png: " + chromium + " did not write " + png + " (exit " +
                   std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
    std::printf("keel report: wrote %s\n", png.c_str());
  }
  std::filesystem::remove_all(dir + "/.chromium-profile");
}

}  // namespace keel::monitor
