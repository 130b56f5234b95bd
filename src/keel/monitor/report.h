// `keel report`: one self-contained HTML file for some runs (dashboard_page.h with their lines and
// Chart.js inlined, so it opens offline), and optionally each chart as a PNG rendered by headless
// Chromium.
#pragma once

#include <string>
#include <vector>

namespace keel::monitor {

// Writes `out` (atomically). Returns the chart ids on the page, for --png.
std::vector<std::string> WriteReport(const std::vector<std::string>& runs, const std::string& out);

// Renders each chart of the report at `html` to DIR/ID.png (width x height) with headless
// Chromium. Throws keel::Error (runtime) with one line when no Chromium is installed.
void RenderPngs(const std::string& html, const std::vector<std::string>& charts,
                const std::string& dir, int width, int height);

}  // namespace keel::monitor
