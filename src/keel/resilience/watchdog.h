// The hang watchdog: a thread per rank that notices a step running longer than the timeout
// (stuck in a collective whose peer never came, or stuck itself) and names who is stuck from the
// ranks' heartbeats, a side channel that does not go through the stuck communicator: the rank
// furthest behind (fewest steps done, then the earliest phase of the step) is the culprit.
//
//   HangWatchdog w(600, dir, rank, [&](const std::string& line, bool self) { ...; _exit(75); });
//   w.Arm(step);  ... the step ...  // Arm again at the next; Disarm around validation
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "keel/resilience/heartbeat.h"

namespace keel::resilience {

// The phases of a step in order; a rank in an earlier one has not reached where the others wait.
int PhaseOrder(const std::string& phase);
// The ranks furthest behind: fewest steps done, then the earliest phase. Empty when all beats
// are at the same step and phase (nobody is behind: the hang is elsewhere, e.g. in MPI).
std::vector<int> StuckRanks(const std::vector<Heartbeat>& beats);
// "rank 1 on host-a (pid 123) is stuck at step 8, phase backward (its last beat 0.4 s ago)".
std::string DescribeStuck(const std::vector<Heartbeat>& beats, const std::vector<int>& stuck);

// Where rank `me` waits (the oldest unfinished collective of a group, from `mine`) and which
// peers have not issued that collective yet, by their beats: "rank 0 waits in world MPI_Allreduce
// #57, which rank 1 on h1 (pid 12) has not issued (it is at #56, in step 13, phase backward)".
// "" when `me` waits in no collective. Peers are the beats that know the group.
std::string DescribeWait(int me, const std::vector<GroupProgress>& mine,
                         const std::vector<Heartbeat>& beats);

class HangWatchdog {
 public:
  // `self`: this rank is the stuck one.
  using OnHang = std::function<void(const std::string& line, bool self)>;
  // timeout_s <= 0: no thread. `heartbeat_dir` may be "" (no culprit can be named).
  HangWatchdog(double timeout_s, std::string heartbeat_dir, int rank, OnHang on_hang);
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  void Arm(int step);  // step `step` (0-based) begins: its clock starts
  void Disarm();

 private:
  void Loop();
  double timeout_s_;
  std::string dir_;
  int rank_;
  OnHang on_hang_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  int step_ = 0;
  double since_ = 0;
  std::thread thread_;
};

}  // namespace keel::resilience
