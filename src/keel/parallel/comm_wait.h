// Waiting on communication the step cannot go on without. A peer that does not answer within
// [parallel] comm_timeout_s is lost or hung: the run exits with code 75 (keel::ExitCode::kTempFail)
// so that a supervisor restarts it, with one line naming what was waited for.
//
//   wait_ms += WaitOrLost(*work, timeout_s, "gradient reduce-scatter");
#pragma once

#include <string>

#include "keel/core/timer.h"
#include "keel/parallel/comm.h"

namespace keel::parallel {

// Returns the milliseconds waited; throws keel::Error (kTempFail) past the timeout.
double WaitOrLost(Work& w, double timeout_s, const std::string& what);

// For destructors, whose buffers an operation still in flight writes into: waits until
// `deadline_s` seconds after `since` (one deadline for all of an object's operations, so a lost
// peer costs comm_timeout_s once, not per operation). True once `w` is over: done, or failed
// (then nothing writes any more). False: it may still write, and its buffer must be leaked.
bool Settled(Work& w, const Timer& since, double deadline_s);

}  // namespace keel::parallel
