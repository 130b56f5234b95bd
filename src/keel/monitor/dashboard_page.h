// The one page behind `keel dashboard` (live: it polls the server's JSON endpoints) and `keel
// report` (static: the runs' lines and Chart.js inlined, so the file opens offline). Charts: loss
// with validation, learning rate, gradient norm, tokens/s, MFU, resident memory, and per run the
// step-time breakdown as a stacked area; events (checkpoints, restarts, rollbacks, alerts ...) are
// vertical markers at their step. Several runs overlay, one colour each.
//
// For tests and screenshots the page keeps `window.keelState()` (points per chart, lines read,
// errors caught) and mirrors it into <pre id="state">; `#only=CHART` shows one chart alone.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace keel::monitor {

// `chart_js`: a <script> element loading Chart.js (a src for the server, the file's text for a
// report). `config`: {"mode": "live"|"static", "runs": [{"name", "metrics": [...], "events":
// [...], "summary": {...}}], "poll_ms": 1000}.
std::string DashboardHtml(const std::string& title, const std::string& chart_js,
                          const nlohmann::json& config);

// `text` made safe inside an inline <script> (no "</script>" can end it early).
std::string ScriptSafe(const std::string& text);

}  // namespace keel::monitor
