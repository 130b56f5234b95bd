#include "keel/parallel/comm_wait.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "keel/core/error.h"

namespace keel::parallel {

namespace {

std::atomic<double> default_deadline_s{-1};

[[noreturn]] void ThrowLost(const std::string& what, double timeout_s) {
  char text[64];
  std::snprintf(text, sizeof text, "%g", timeout_s);
  throw Error(ExitCode::kTempFail, what + " did not complete within [parallel] comm_timeout_s = " +
                                       text + " s: a peer is lost or hung");
}

// `what` the caller waited for, with the operation's own name (Work::describe) when it has one.
std::string Name(const Work& w, const std::string& what) {
  const std::string d = w.describe();
  if (d.empty()) return what;
  return what.empty() ? d : what + " (" + d + ")";
}

}  // namespace

double WaitOrLost(Work& w, double timeout_s, const std::string& what) {
  Timer t;
  if (!w.Wait(timeout_s)) ThrowLost(Name(w, what), timeout_s);
  return t.Millis();
}

void SetDefaultWaitDeadline(double seconds) { default_deadline_s = seconds; }

void WaitOrLostDefault(Work& w, const std::string& what) {
  const double timeout_s = default_deadline_s;
  if (!w.Wait(timeout_s)) ThrowLost(Name(w, what), timeout_s);
}

bool Settled(Work& w, const Timer& since, double deadline_s) {
  try {
    return w.Wait(std::max(0.0, deadline_s - since.Seconds()));
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace keel::parallel
