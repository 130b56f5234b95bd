// File helpers shared by data/, ckpt/, resilience/ and train/; see file_util.h.
#include "keel/core/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "keel/core/error.h"
#include "keel/core/validate.h"

namespace keel {
namespace {

// Closes a file descriptor on every path out of a function.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string Reason() { return std::strerror(errno); }

// Opens a regular file for reading. O_NONBLOCK keeps open() itself from waiting for a writer
// when the path is a FIFO, which is then refused; it is cleared for the reads.
int OpenRegular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) ThrowBadInput(path + ": cannot read: " + Reason());
  FdGuard guard(fd);
  if (::fstat(fd, st) != 0) ThrowBadInput(path + ": cannot stat: " + Reason());
  if (S_ISDIR(st->st_mode)) ThrowBadInput(path + ": expected a file, found a folder");
  if (!S_ISREG(st->st_mode)) CheckRegularFile(path);  // names what it found
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return guard.release();
}

}  // namespace

std::string ReadWholeFile(const std::string& path) {
  struct stat st {};
  FdGuard fd(OpenRegular(path, &st));
  std::string out;
  out.resize(size_t(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ThrowBadInput(path + ": cannot read: " + Reason());
    if (n == 0) break;  // the file shrank under us; return what is there
    done += size_t(n);
  }
  out.resize(done);
  return out;
}

void SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void WriteFileAtomic(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp";
  {
    FdGuard fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) ThrowRuntime(tmp + ": cannot create: " + Reason());
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) ThrowRuntime(tmp + ": cannot write: " + Reason());
      done += size_t(n);
    }
    if (::fsync(fd.get()) != 0) ThrowRuntime(tmp + ": cannot fsync: " + Reason());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ThrowRuntime(tmp + ": cannot rename to " + path + ": " + Reason());
  }
  size_t slash = path.find_last_of('/');
  SyncDir(slash == std::string::npos ? "." : path.substr(0, slash));
}

MappedFile MappedFile::Open(const std::string& path) {
  struct stat st {};
  FdGuard fd(OpenRegular(path, &st));
  MappedFile f;
  f.size_ = size_t(st.st_size);
  if (f.size_ == 0) return f;  // mmap of length 0 is an error; an empty view is fine
  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) ThrowRuntime(path + ": cannot mmap: " + Reason());
  f.data_ = static_cast<const uint8_t*>(p);
  return f;  // the mapping outlives the descriptor, as POSIX guarantees
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace keel
