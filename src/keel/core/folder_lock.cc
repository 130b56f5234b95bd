#include "keel/core/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "keel/core/error.h"
#include "keel/core/host.h"
#include "keel/core/log.h"

namespace keel {
namespace {

constexpr const char* kLockFile = "/.keel.lock";

std::string ThisHolder() { return "host " + HostName() + ", pid " + std::to_string(::getpid()); }

std::string ReadHolder(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s(buf, n > 0 ? size_t(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// The pid of a holder line written on this host, or 0.
pid_t SameHostPid(const std::string& line) {
  const std::string mine = ThisHolder();
  const size_t cut = mine.find(", pid ");
  if (line.compare(0, cut + 6, mine, 0, cut + 6) != 0) return 0;
  return pid_t(std::atol(line.c_str() + cut + 6));
}

}  // namespace

FolderLock FolderLock::Acquire(const std::string& dir, const std::string& who) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) ThrowBadInput(who + ": " + dir + ": cannot create the run folder: " + ec.message());
  const std::string path = dir + kLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) ThrowBadInput(who + ": " + path + ": cannot open: " + std::strerror(errno));
  FolderLock lock;
  lock.fd_ = fd;  // closed by the destructor on every path out
  const std::string before = ReadHolder(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = ReadHolder(fd);
    if (const char* sup = std::getenv("KEEL_RUN_LOCK_HOLDER"); sup && holder == sup) {
      lock.holder_ = holder;  // our supervisor's; it holds the lock for us
      ::close(std::exchange(lock.fd_, -1));
      return lock;
    }
    ThrowBadInput(who + ": " + dir + " is in use by another keel job (" +
                  (holder.empty() ? "holder unknown" : holder) +
                  "): two jobs on one run folder would mix their checkpoints; wait for it, stop "
                  "it, or pick another train.name");
  }
  if (const pid_t dead = SameHostPid(before); dead > 0 && dead != ::getpid())
    Log("keel: %s: taking over the lock of %s (no longer running)", dir.c_str(), before.c_str());
  lock.holder_ = ThisHolder();
  const std::string line = lock.holder_ + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != ssize_t(line.size()))
    ThrowRuntime(who + ": " + path + ": cannot write: " + std::strerror(errno));
  return lock;
}

bool FolderLock::HeldByOther(const std::string& dir, std::string* holder) {
  const int fd = ::open((dir + kLockFile).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  if (held && holder) *holder = ReadHolder(fd);
  ::close(fd);  // drops the shared lock taken when it was free
  return held;
}

void FolderLock::CheckNotInBusyFolder(const std::string& what, const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  if (ec) return;
  for (p = p.parent_path(); !p.empty(); p = p.parent_path()) {
    std::string holder;
    if (HeldByOther(p.string(), &holder))
      ThrowBadInput(what + " " + path + ": inside " + p.string() +
                    ", a run folder that a keel job is training (" + holder +
                    "); write elsewhere, or wait for it to finish");
    if (p == p.root_path()) break;
  }
}

FolderLock::FolderLock(FolderLock&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), holder_(std::move(o.holder_)) {}

FolderLock& FolderLock::operator=(FolderLock&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(holder_, o.holder_);
  return *this;
}

FolderLock::~FolderLock() {
  if (fd_ < 0) return;
  // A holder line left in the file means a holder that died: the next one says it took over.
  if (!holder_.empty()) (void)!::ftruncate(fd_, 0);
  ::close(fd_);
}

}  // namespace keel
