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

// Returns the milliseconds waited; throws keel::Error (kTempFail) past the timeout (a negative
// timeout waits forever), naming `what` and the operation (Work::describe).
double WaitOrLost(Work& w, double timeout_s, const std::string& what);

// The deadline of the waits that name none: blocking collectives, barriers, broadcasts, blocking
// sends and receives, and the communicators' own waits. The trainer sets it to [parallel]
// comm_timeout_s once the ranks agree on their setup, so that no wait of the step or the loop
// outlives a lost peer; negative (the default, and for tools such as keel eval): none.
void SetDefaultWaitDeadline(double seconds);

// Waits for `w` up to the default deadline; past it, throws keel::Error (kTempFail) naming `what`
// and the operation (Work::describe: its group, operation and sequence number in the group).
void WaitOrLostDefault(Work& w, const std::string& what = "");

// For destructors, whose buffers an operation still in flight writes into: waits until
// `deadline_s` seconds after `since` (one deadline for all of an object's operations, so a lost
// peer costs comm_timeout_s once, not per operation). True once `w` is over: done, or failed
// (then nothing writes any more). False: it may still write, and its buffer must be leaked.
bool Settled(Work& w, const Timer& since, double deadline_s);

}  // namespace keel::parallel
