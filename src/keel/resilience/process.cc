#include "keel/resilience/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "keel/core/error.h"

namespace keel::resilience {

Child::Child(const std::vector<std::string>& argv, const std::string& log_path, bool echo)
    : echo_(echo) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) ThrowRuntime(std::string("pipe: ") + std::strerror(errno));
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) ThrowRuntime(log_path + ": cannot open: " + std::strerror(errno));
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) ThrowRuntime(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    ::setpgid(0, 0);
    // keel blocks SIGINT/SIGTERM in main() for its own sigwait thread; a child must get them.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    // No stdin: mpirun would forward it to rank 0, and that traffic keeps its links to remote
    // daemons from ever looking idle to TCP keepalive (which is how it notices a lost host).
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "keel launch: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: whichever runs first, the group exists before a Signal
  ::close(fds[1]);
  reader_ = std::thread([this, fd = fds[0], log_fd] { Read(fd, log_fd); });
}

Child::~Child() {
  if (!done_) {
    Signal(SIGKILL);
    int st;
    Wait(10, &st);
  }
  Drain();
}

void Child::Drain() {
  stop_reader_ = true;
  if (reader_.joinable()) reader_.join();
}

void Child::Read(int fd, int log_fd) {
  std::string partial;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      // Orphans of a killed job may hold the pipe open for ever: give up once the child is gone.
      if (stop_reader_) break;
      continue;
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (echo_) (void)!::write(1, buf, size_t(n));
    if (log_fd >= 0) (void)!::write(log_fd, buf, size_t(n));
    partial.append(buf, size_t(n));
    size_t nl;
    std::lock_guard<std::mutex> lock(mu_);
    while ((nl = partial.find('\n')) != std::string::npos) {
      std::string line = partial.substr(0, nl);
      partial.erase(0, nl + 1);
      const size_t at = line.find("keel: error:");
      if (at != std::string::npos && errors_.size() < 16) errors_.push_back(line.substr(at));
      tail_.push_back(std::move(line));
      if (tail_.size() > 40) tail_.erase(tail_.begin());
    }
  }
  ::close(fd);
  if (log_fd >= 0) ::close(log_fd);
}

bool Child::Poll(int* status) {
  if (done_) {
    *status = status_;
    return true;
  }
  const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) {
    done_ = true;
    *status = status_;
  } else if (r < 0 && errno == ECHILD) {
    // Reaped already (KillDescendants reaps whatever ended): gone, its status unknown, which is
    // never taken for a clean exit.
    done_ = true;
    status_ = *status = 255 << 8;
  }
  return done_;
}

bool Child::Wait(double timeout_s, int* status) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!Poll(status)) {
    if (std::chrono::steady_clock::now() >= end) return false;
    ::usleep(20000);
  }
  return true;
}

void Child::Signal(int sig) const {
  if (pid_ > 0 && !done_) ::kill(-pid_, sig);
}

std::vector<std::string> Child::ErrorLines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

std::string Child::Tail(size_t lines) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (size_t i = tail_.size() > lines ? tail_.size() - lines : 0; i < tail_.size(); ++i)
    out += tail_[i] + "\n";
  return out;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void BecomeSubreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

namespace {

// Every live descendant of this process (zombies are reaped, not listed), but those `keep` is true
// for, their descendants and their ancestors.
std::vector<pid_t> Descendants(const std::function<bool(pid_t)>& keep) {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  std::multimap<pid_t, pid_t> children;  // ppid -> pid
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid;
    if (rest >> state >> ppid && state != 'Z') children.emplace(ppid, pid_t(std::stol(name)));
  }
  std::vector<pid_t> todo = {::getpid()}, found;
  std::map<pid_t, pid_t> parent;
  std::set<pid_t> spared;
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      parent[it->second] = p;
      if (keep && keep(it->second)) {
        for (pid_t a = p; parent.count(a); a = parent[a]) spared.insert(a);
        continue;  // nor its descendants
      }
      found.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  std::erase_if(found, [&](pid_t p) { return spared.count(p) > 0; });
  return found;
}

}  // namespace

std::vector<std::string> CommandLineOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> out;
  for (std::string arg; std::getline(in, arg, '\0');) out.push_back(arg);
  return out;
}

int KillDescendants(double grace_s, const std::function<bool(pid_t)>& keep) {
  // Remote daemons and launcher agents finish on their own shortly after the launcher: give
  // them `grace_s` before counting what is left as left behind.
  for (double t = 0; t < grace_s && !Descendants(keep).empty(); t += 0.05) ::usleep(50000);
  int killed = 0;
  // Orphans reparent to us as their parents die, so a few passes catch whole trees.
  for (int pass = 0; pass < 5; ++pass) {
    const std::vector<pid_t> found = Descendants(keep);
    if (found.empty()) break;
    for (pid_t p : found) ::kill(p, SIGKILL);
    killed += int(found.size());
    ::usleep(50000);
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  return killed;
}

bool RunCaptured(const std::vector<std::string>& argv, double timeout_s, std::string* output,
                 int* status) {
  Child c(argv, "", /*echo=*/false);
  const bool ended = c.Wait(timeout_s, status);
  if (!ended) {
    c.Signal(SIGKILL);
    c.Wait(5, status);
  }
  c.Drain();
  *output = c.Tail(200);
  return ended;
}

}  // namespace keel::resilience
