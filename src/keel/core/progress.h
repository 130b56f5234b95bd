// Progress of long work on stderr, with its rate and ETA:
//   prepare: 412 MB of 1.40 GB (29%), 95.1 MB/s, ETA 11s; 81,200 docs
// On a terminal one line, rewritten at most every 0.5 s; otherwise (a log file, CI) one line per
// 10% and one at the end, so that logs stay short. Silent for work done within its first second.
//
//   Progress p("verify", total_bytes, "B");
//   p.Update(done_bytes, "3 of 12 files");
//   p.Finish();
#pragma once

#include <chrono>
#include <string>

namespace keel {

class Progress {
 public:
  // `total` 0: unknown (no percentage, no ETA). `unit` "B" prints bytes as kB/MB/GB; anything
  // else is printed after the count ("docs").
  Progress(std::string label, double total, std::string unit = "B", bool enabled = true);
  ~Progress();

  void Update(double done, const std::string& extra = "");
  // The last line (done = total unless given), when anything was printed before.
  void Finish(const std::string& extra = "");
  void Finish(double done, const std::string& extra);

 private:
  void Print(double done, const std::string& extra, bool last);

  using Clock = std::chrono::steady_clock;
  const std::string label_, unit_;
  const double total_;
  const bool enabled_, tty_;
  Clock::time_point start_ = Clock::now(), last_print_;
  int last_decile_ = -1;
  bool printed_ = false, finished_ = false;
  double done_ = 0;
};

// "42s", "3m05s", "1h02m", "2d03h"; "?" for a negative time.
std::string FormatDuration(double seconds);
// "412 MB", "1.40 GB", "950 B"; "81,200 docs" for other units.
std::string FormatAmount(double v, const std::string& unit);

}  // namespace keel
