// One owner per run folder: an flock(2) on FOLDER/.keel.lock, with the holder's host and pid
// written in it so that a second job can say who holds it. flock is released by the kernel when
// its holder dies, so a lock left by a crash is taken over at once (with a line saying so); it
// works on local file systems and on NFS (as a lease that ends with the holder's host).
//
//   FolderLock lock = FolderLock::Acquire("runs/quickstart", "keel train");  // or exit 2
//
// A supervisor (keel launch) holds the lock for the jobs it starts: it puts its holder line in
// KEEL_RUN_LOCK_HOLDER, and a job that finds the lock held by that holder goes on without it.
#pragma once

#include <string>

namespace keel {

class FolderLock {
 public:
  // Creates `dir` if needed and locks it. Throws keel::Error (bad input) naming the holder when
  // another process holds it; `who` is the command asking ("keel train").
  static FolderLock Acquire(const std::string& dir, const std::string& who);
  // Throws keel::Error (bad input) when `path` lies in a run folder (at any depth) that another
  // job holds: what `what` would write there, that job could overwrite or delete.
  static void CheckNotInBusyFolder(const std::string& what, const std::string& path);
  // Whether another process holds `dir`'s lock now; its holder line ("host HOST, pid PID") in
  // `holder`. Creates nothing.
  static bool HeldByOther(const std::string& dir, std::string* holder);

  FolderLock() = default;
  FolderLock(FolderLock&& o) noexcept;
  FolderLock& operator=(FolderLock&& o) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

  // "host HOST, pid PID": what KEEL_RUN_LOCK_HOLDER carries to the jobs this holder starts.
  const std::string& holder() const { return holder_; }

 private:
  int fd_ = -1;
  std::string holder_;
};

}  // namespace keel
