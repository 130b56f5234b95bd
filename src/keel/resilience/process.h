// A child process for the supervisor: started in its own process group (so that a signal reaches
// mpirun and the ranks it started here), its output copied line by line to the console and to a
// log file, the lines that say why it failed ("keel: error: ...") kept for the supervisor's own
// message.
//
//   resilience::Child job({"mpirun", "-np", "4", "keel", "train", ...}, "RUN/logs/launch_1.log");
//   while (!job.Poll(&status)) { ...heartbeats... }
//   job.Signal(SIGUSR2);   // to the whole group
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace keel::resilience {

class Child {
 public:
  // Starts argv[0] (searched in PATH). `log_path` "" keeps no log; `echo` copies the output to
  // this process's stdout. Throws keel::Error if the process cannot be started.
  Child(const std::vector<std::string>& argv, const std::string& log_path, bool echo);
  ~Child();  // kills the group if it still runs, and reaps it
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // True once the process ended; `status` is waitpid's. Does not block.
  bool Poll(int* status);
  // Waits up to `timeout_s`; true if it ended.
  bool Wait(double timeout_s, int* status);
  void Signal(int sig) const;  // to the process group
  // After the process ended: reads what is left of its output (until the pipe is quiet).
  void Drain();
  // Output lines that start with "keel: error:" or "keel launch:" (the first few), and the last
  // lines of output, for messages.
  std::vector<std::string> ErrorLines() const;
  std::string Tail(size_t lines) const;

 private:
  void Read(int fd, int log_fd);

  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = 0;
  bool echo_ = false;
  std::atomic<bool> stop_reader_{false};
  std::thread reader_;
  mutable std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::string> tail_;
};

// "exit 75", "signal 9 (Killed)": a waitpid status in words.
std::string DescribeStatus(int status);
// The exit code a status stands for: the code, or 128 + the signal.
int ExitCodeOf(int status);
// Makes this process the reaper of its orphaned descendants (Linux), so that KillDescendants can
// find what a killed job left behind.
void BecomeSubreaper();
// Waits up to `grace_s` for this process's descendants to end, then SIGKILLs what is left and
// returns how many that was. A process for which `keep` is true is left alone with its
// descendants and its ancestors (tier-0 holders outlive the job, and so must the launcher daemon
// that runs one, which daemonized and answers to this process now).
int KillDescendants(double grace_s, const std::function<bool(pid_t)>& keep = {});
// The command line of a process, its arguments split; empty when it is gone.
std::vector<std::string> CommandLineOf(pid_t pid);
// Runs argv to completion within `timeout_s`, capturing its output; false on timeout (the group is
// killed). `status` is waitpid's.
bool RunCaptured(const std::vector<std::string>& argv, double timeout_s, std::string* output,
                 int* status);

}  // namespace keel::resilience
