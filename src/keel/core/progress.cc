#include "keel/core/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace keel {
std::string FormatDuration(double seconds) {
  if (seconds < 0) return "?";
  const long s = long(seconds + 0.5);
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else if (s < 86400)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  else
    std::snprintf(buf, sizeof buf, "%ldd%02ldh", s / 86400, (s % 86400) / 3600);
  return buf;
}

std::string FormatAmount(double v, const std::string& unit) {
  char b[48];
  if (unit == "B") {
    if (v >= 1e9)
      std::snprintf(b, sizeof b, "%.2f GB", v / 1e9);
    else if (v >= 1e6)
      std::snprintf(b, sizeof b, "%.0f MB", v / 1e6);
    else if (v >= 1e3)
      std::snprintf(b, sizeof b, "%.0f kB", v / 1e3);
    else
      std::snprintf(b, sizeof b, "%.0f B", v);
    return b;
  }
  std::string digits = std::to_string(static_cast<long long>(std::llround(v))), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out + " " + unit;
}

Progress::Progress(std::string label, double total, std::string unit, bool enabled)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled),
      tty_(::isatty(2) == 1) {}

Progress::~Progress() {
  if (printed_ && !finished_ && tty_) std::fprintf(stderr, "\n");  // leave the line as it was
}

void Progress::Update(double done, const std::string& extra) {
  done_ = done;
  if (!enabled_) return;
  const auto now = Clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  if (tty_) {
    if (now - last_print_ < std::chrono::milliseconds(500)) return;
  } else {
    const int decile =
        total_ > 0 ? int(10 * done / total_) : int((now - start_) / std::chrono::seconds(30));
    if (decile <= last_decile_) return;
    last_decile_ = decile;
  }
  last_print_ = now;
  Print(done, extra, false);
}

void Progress::Finish(const std::string& extra) { Finish(total_ > 0 ? total_ : done_, extra); }

void Progress::Finish(double done, const std::string& extra) {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && printed_) Print(done, extra, true);
}

void Progress::Print(double done, const std::string& extra, bool last) {
  const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
  std::string line = label_ + ": " + FormatAmount(done, unit_);
  char part[96];
  if (total_ > 0) {
    std::snprintf(part, sizeof part, " of %s (%.0f%%)", FormatAmount(total_, unit_).c_str(),
                  100 * done / total_);
    line += part;
  }
  if (secs > 0) line += ", " + FormatAmount(done / secs, unit_) + "/s";
  if (last)
    line += ", took " + FormatDuration(secs);
  else if (total_ > 0 && done > 0)
    line += ", ETA " + FormatDuration(secs * (total_ - done) / done);
  if (!extra.empty()) line += "; " + extra;
  std::fprintf(stderr, "%s%s%s", tty_ ? "\r\033[K" : "", line.c_str(), tty_ && !last ? "" : "\n");
  std::fflush(stderr);
  printed_ = true;
}

}  // namespace keel
