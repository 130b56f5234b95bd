// `keel dashboard`: serves the page of dashboard_page.h for some runs on one port (cpp-httplib),
// with Chart.js from Debian's libjs-chart.js, and JSON endpoints the page polls:
//   GET /                          the page
//   GET /chart.js                  Chart.js, from the package's files
//   GET /api/metrics?run=I&since=B  run I's metrics.jsonl lines from byte B: {"lines", "next",
//                                  "summary"}
//   GET /api/events?run=I&since=B   the same for events.jsonl
// Lines over kMaxLineBytes (run_files.h) are left out and counted ("skipped" beside "next"); the
// page shows the count. Connections are guarded (http_guard.h). Read-only. With a token, every
// request needs ?token=T or "Authorization: Bearer T" (401 otherwise); an address other than
// loopback needs a token.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/monitor/http_guard.h"

namespace keel::monitor {

struct DashboardOptions {
  std::vector<std::string> runs;  // run folders
  std::string addr = "127.0.0.1";
  int port = 8800;  // 0: any free port (printed)
  std::string token;
  int poll_ms = 1000;
};

// The dashboard's routes on a GuardedServer, not yet listening: ServeDashboard's, and the fuzz
// target's. `o` must outlive it; `chart` is Chart.js's text.
std::unique_ptr<GuardedServer> MakeDashboardServer(const DashboardOptions& o,
                                                   const std::string& chart);

// Runs until SIGINT or SIGTERM. Throws keel::Error (bad input) for a run that is not a run
// folder, a port it cannot listen on, or a non-loopback address without a token.
void ServeDashboard(const DashboardOptions& o);

// Chart.js as Debian installs it (KEEL_CHARTJS overrides); throws keel::Error naming the package
// when it is missing.
std::string ChartJsPath();

// A run's figures for the summary table that are not in its lines (goodput.json, when the run was
// supervised by keel launch).
nlohmann::json RunSummary(const std::string& run_dir);

}  // namespace keel::monitor
