#include "keel/parallel/comm_wait.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "keel/core/error.h"

namespace keel::parallel {

double WaitOrLost(Work& w, double timeout_s, const std::string& what) {
  Timer t;
  if (w.Wait(timeout_s)) return t.Millis();
  char text[64];
  std::snprintf(text, sizeof text, "%g", timeout_s);
  throw Error(ExitCode::kTempFail, what + " did not complete within [parallel] comm_timeout_s = " +
                                       text + " s: a peer is lost or hung");
}

namespace {
std::atomic<double> default_deadline_s{-1};
}  // namespace

void SetDefaultWaitDeadline(double seconds) { default_deadline_s = seconds; }

void WaitOrLostDefault(Work& w, const std::string& group, const std::string& op, uint64_t seq) {
  WaitOrLost(w, default_deadline_s, group + " " + op + (seq ? " #" + std::to_string(seq) : ""));
}

bool Settled(Work& w, const Timer& since, double deadline_s) {
  try {
    return w.Wait(std::max(0.0, deadline_s - since.Seconds()));
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace keel::parallel
