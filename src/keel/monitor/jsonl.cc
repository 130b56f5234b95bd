#include "keel/monitor/jsonl.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "keel/core/error.h"
#include "keel/core/log.h"

namespace keel::monitor {

JsonlWriter::JsonlWriter(const std::string& path)
    : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)), path_(path) {
  if (fd_ < 0) ThrowRuntime("open " + path + ": " + std::strerror(errno));
}

void JsonlWriter::Reopen() {
  const std::lock_guard<std::mutex> lock(*mu_);
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) ThrowRuntime("open " + path_ + ": " + std::strerror(errno));
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

JsonlWriter& JsonlWriter::operator=(JsonlWriter&& o) noexcept {
  std::swap(mu_, o.mu_);
  std::swap(fd_, o.fd_);
  std::swap(path_, o.path_);
  std::swap(failed_, o.failed_);
  std::swap(failure_, o.failure_);
  return *this;
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::Write(const nlohmann::json& obj) {
  if (fd_ < 0) return;
  const std::string line = obj.dump() + "\n";
  const std::lock_guard<std::mutex> lock(*mu_);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  if (done == line.size()) return;
  const int err = errno;
  // Never leave half a line: a reader of the file sees whole lines or none. Another process may
  // append to the same file (the supervisor and rank 0 share events.jsonl): the cut starts where
  // this line began, and only while the file still ends with it.
  if (done > 0) {
    const off_t end = ::lseek(fd_, 0, SEEK_CUR);
    struct stat st {};
    const bool last = end >= off_t(done) && ::fstat(fd_, &st) == 0 && st.st_size == end;
    if (!last || ::ftruncate(fd_, end - off_t(done)) != 0)
      Log("keel: warning: %s: could not cut a partly written line back off (%s)", path_.c_str(),
          last ? std::strerror(errno) : "another writer appended after it");
  }
  if (failed_++ == 0) {
    failure_ = std::strerror(err ? err : ENOSPC);
    Log("keel: warning: cannot write %s (%s): this line and any later one that fails are lost; "
        "the run goes on and will exit 1 with its outputs incomplete",
        path_.c_str(), failure_.c_str());
  }
}

}  // namespace keel::monitor
