#include "keel/monitor/dashboard_server.h"

#include <httplib.h>
#include <signal.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "keel/core/error.h"
#include "keel/core/validate.h"
#include "keel/monitor/dashboard_page.h"
#include "keel/monitor/run_files.h"

namespace keel::monitor {
namespace {

std::string PercentEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

bool Authorized(const httplib::Request& req, const std::string& token) {
  if (token.empty()) return true;
  if (req.has_param("token") && req.get_param_value("token") == token) return true;
  return req.get_header_value("Authorization") == "Bearer " + token;
}

}  // namespace

std::string ChartJsPath() {
  if (const char* p = std::getenv("KEEL_CHARTJS"); p && *p) return p;
  const std::string path = "/usr/share/javascript/chart.js/chart.min.js";
  if (!std::filesystem::exists(path))
    ThrowBadInput(path +
                  ": missing; the dashboard and reports draw with Debian's Chart.js "
                  "(apt-get install libjs-chart.js)");
  return path;
}

nlohmann::json RunSummary(const std::string& run_dir) {
  nlohmann::json s = nlohmann::json::object();
  std::ifstream in(run_dir + "/goodput.json");
  if (in) {
    nlohmann::json g = nlohmann::json::parse(in, nullptr, false);
    if (g.is_object() && g.contains("goodput") && g["goodput"].is_number())
      s["goodput"] = g["goodput"];
  }
  return s;
}

std::unique_ptr<GuardedServer> MakeDashboardServer(const DashboardOptions& o,
                                                   const std::string& chart) {
  nlohmann::json runs = nlohmann::json::array();
  for (const std::string& r : o.runs) runs.push_back({{"name", CheckRunDir(r)}});
  auto svr = std::make_unique<GuardedServer>(GuardedServer::Limits{});
  svr->set_pre_routing_handler([&o](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, o.token)) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_content("keel dashboard: this server needs its token (?token=...)\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr->Get("/", [&o, runs](const httplib::Request&, httplib::Response& res) {
    // The page's own request for Chart.js carries the token: the server's (the request had to
    // match it), percent-encoded. The request's text is never copied into the page.
    const std::string q = o.token.empty() ? "" : "?token=" + PercentEncode(o.token);
    std::string title = "keel:";
    for (const auto& r : runs) title.append(" ").append(r["name"].get<std::string>());
    const nlohmann::json cfg = {{"mode", "live"}, {"runs", runs}, {"poll_ms", o.poll_ms}};
    res.set_content(DashboardHtml(title, "<script src=\"chart.js" + q + "\"></script>", cfg),
                    "text/html; charset=utf-8");
  });
  svr->Get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) {
    res.status = 204;  // none; a 404 would be an error in the browser's console
  });
  svr->Get("/chart.js", [chart](const httplib::Request&, httplib::Response& res) {
    res.set_content(chart, "application/javascript");
  });
  auto lines = [&](const char* file) {
    return [&o, file](const httplib::Request& req, httplib::Response& res) {
      size_t run = 0;
      uint64_t since = 0;
      try {
        run = std::stoul(req.get_param_value("run"));
        since = req.has_param("since") ? std::stoull(req.get_param_value("since")) : 0;
      } catch (const std::exception&) {
        run = o.runs.size();
      }
      if (run >= o.runs.size()) {
        res.status = 400;
        res.set_content("expected ?run=0.." + std::to_string(o.runs.size() - 1) + "&since=BYTES\n",
                        "text/plain");
        return;
      }
      const LinesRead r = ReadLinesFrom(o.runs[run] + "/" + file, since);
      size_t skipped = r.skipped;
      nlohmann::json out = {{"lines", ParseJsonLines(r.lines, &skipped)}, {"next", r.next}};
      if (r.reset) out["reset"] = true;
      if (skipped) out["skipped"] = skipped;
      out["summary"] = RunSummary(o.runs[run]);
      res.set_content(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "application/json");
    };
  };
  svr->Get("/api/metrics", lines("metrics.jsonl"));
  svr->Get("/api/events", lines("events.jsonl"));

  return svr;
}

void ServeDashboard(const DashboardOptions& o) {
  if (o.runs.empty()) ThrowBadInput("keel dashboard: expected at least one run folder");
  const std::string addr = CheckListenAddress("keel dashboard --addr", o.addr);
  if (!IsLoopbackAddress(addr) && o.token.empty())
    ThrowBadInput("keel dashboard --addr " + o.addr +
                  ": reachable from other machines; pass --token too (the page then needs "
                  "?token=...)");
  const std::string chart_path = ChartJsPath();
  std::ifstream cin(chart_path);
  std::stringstream chart_js;
  chart_js << cin.rdbuf();
  const std::unique_ptr<GuardedServer> svr = MakeDashboardServer(o, chart_js.str());
  const int port = svr->Listen(addr, o.port);
  if (port <= 0)
    ThrowBadInput("keel dashboard --port " + std::to_string(o.port) + ": cannot listen on " +
                  o.addr + ":" + std::to_string(o.port) + " (in use?); pick another, or 0 for any");

  // SIGINT/SIGTERM are waited for here; the server's threads never see them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::thread server([&] { svr->Run(); });
  const bool v6 = addr.find(':') != std::string::npos;
  std::printf("keel dashboard: http://%s%s%s:%d/%s (%zu run(s); Ctrl-C to stop)\n", v6 ? "[" : "",
              addr.c_str(), v6 ? "]" : "", port, o.token.empty() ? "" : "?token=...",
              o.runs.size());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  svr->Stop();
  server.join();
}

}  // namespace keel::monitor
