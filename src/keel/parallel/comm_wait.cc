#include "keel/parallel/comm_wait.h"

#include <algorithm>

#include "keel/core/error.h"

namespace keel::parallel {

double WaitOrLost(Work& w, double timeout_s, const std::string& what) {
  Timer t;
  if (!w.Wait(timeout_s))
    throw Error(ExitCode::kTempFail, what +
                                         " did not complete within [parallel] comm_timeout_s = " +
                                         std::to_string(timeout_s) + " s: a peer is lost or hung");
  return t.Millis();
}

bool Settled(Work& w, const Timer& since, double deadline_s) {
  try {
    return w.Wait(std::max(0.0, deadline_s - since.Seconds()));
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace keel::parallel
