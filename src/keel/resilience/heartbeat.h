// Heartbeats: each rank of a run rewrites RUN/heartbeat/rank_NNNNN.json every few seconds with
// its host, pid, step and phase, so that a supervisor (keel launch) can tell a rank that stopped
// (killed, frozen, its host gone) from one that is slow, name it and its host, and account for
// where the time went. The file is replaced by rename, so a reader never sees half of one.
//
//   resilience::HeartbeatWriter hb(run_dir + "/heartbeat", comm.rank(), 5.0);
//   hb.Set(step, "train");            // from the training loop; the thread writes it
//   hb.Finish(0, "");                 // the last beat says how the rank ended
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "keel/core/collective_progress.h"

namespace keel::resilience {

struct Heartbeat {
  int rank = 0;
  std::string host;
  int64_t pid = 0;
  int step = 0;              // steps completed
  std::string phase;         // setup, resume, train, validate, checkpoint, exit
  double time = 0;           // unix seconds of this beat
  int start_step = -1;       // the step the run (re)started from; -1 before it is known
  double loop_start = 0;     // unix seconds when the training loop began; 0 before
  double last_step_end = 0;  // unix seconds when the newest step finished; 0 before
  bool exited = false;       // the rank wrote its last beat on its way out
  int exit_code = 0;
  std::string error;     // the rank's error line, when it exited with one
  bool culprit = false;  // the rank found the fault in itself (a hang, corruption, slowness)
  // Each communicator's collectives issued and finished (core/collective_progress.h): where a
  // rank waits, and which peer has not yet issued what it waits in.
  std::vector<GroupProgress> collectives;
};

class HeartbeatWriter {
 public:
  // `period_s` <= 0 writes nothing. Creates `dir`; throws keel::Error if it cannot.
  HeartbeatWriter(const std::string& dir, int rank, double period_s);
  ~HeartbeatWriter();  // stops the thread; the file stays (Finish says how the rank ended)
  HeartbeatWriter(const HeartbeatWriter&) = delete;
  HeartbeatWriter& operator=(const HeartbeatWriter&) = delete;

  void Set(int step, const char* phase);  // cheap: the thread writes it on its next beat
  void StartedAt(int start_step);         // the training loop begins at this step
  void StepDone(int step);                // a step finished (its time is recorded)
  // This rank is the one at fault (a detector named it): its last beat says so, and keel launch
  // charges its host rather than treating the exit as a lost peer's.
  void BlameSelf();
  // Writes the last beat at once, with how the rank ends. Later Sets are ignored.
  void Finish(int exit_code, const std::string& error);

 private:
  void Loop();
  void WriteNow();

  std::string path_;
  double period_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Heartbeat beat_;
  std::thread thread_;
};

// Path of rank `rank`'s file in `dir`.
std::string HeartbeatPath(const std::string& dir, int rank);
// Every heartbeat file in `dir` that parses, sorted by rank; a missing folder gives none.
std::vector<Heartbeat> ReadHeartbeats(const std::string& dir);
// Removes the heartbeat files of an earlier start, so that a new one is judged by its own.
void ClearHeartbeats(const std::string& dir);
double UnixNow();

}  // namespace keel::resilience
