// Where this process stands in each communicator's sequence of collectives: how many it issued,
// how many finished, and which operation the oldest unfinished one is. Every rank of a group
// issues the group's collectives in the same order, so sequence numbers compare across ranks:
// a rank waiting in #57 of "dp#0" while a peer has issued only #56 waits for that peer. The hang
// watchdog reads it (through the heartbeats) without going through the stuck communicator.
// Pipeline transfers are counted the same way, per stream ("pp#0 1->0 tag 11": one direction and
// tag between two ranks of a group), in which both ends count the same messages in order.
//
//   const uint64_t seq = NoteIssued("dp#0", "MPI_Allreduce");  // when the op is queued
//   NoteDone("dp#0", seq);                                     // when it returns
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keel {

struct GroupProgress {
  std::string group;    // "world", "dp#0", "tp#3", ..., "pp#0 1->0 tag 11"
  uint64_t issued = 0;  // collectives issued (the newest's sequence number)
  uint64_t done = 0;    // finished, in order
  std::string op;       // the oldest unfinished one's operation ("" when none is waiting)
};

// An empty group is not counted (NoteIssued returns 0).
// `op` is copied: a caller's name may not outlive the call.
uint64_t NoteIssued(const std::string& group, std::string op);
void NoteDone(const std::string& group, uint64_t seq);
// Every group this process issued a collective on, in the order first seen.
std::vector<GroupProgress> CollectiveProgress();

}  // namespace keel
