// An append-only JSON-lines file (metrics.jsonl, events.jsonl): one object per line, written with
// one write(2) and so never interleaved; a crash loses at most the line being written. Write may
// be called from several threads (the alerts' timer writes events beside the training loop).
//
// A line that cannot be written whole (a full disk, a file-size limit) is cut back off the file,
// so that every line in it is complete; the first failure is reported once on stderr, and every
// failed line is counted: the trainer ends such a run with exit 1, its outputs incomplete.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace keel::monitor {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path);  // throws keel::Error if it cannot open
  JsonlWriter(JsonlWriter&& o) noexcept { *this = std::move(o); }
  JsonlWriter& operator=(JsonlWriter&& o) noexcept;
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter();

  void Write(const nlohmann::json& obj);
  // Opens the path again (a file replaced under the writer: a resumed or rolled-back run's
  // metrics.jsonl), keeping the count of lines already lost: the run must still exit 1 for them.
  // Throws keel::Error if it cannot open.
  void Reopen();
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Lines that could not be written, and why the first one failed.
  int64_t failed_lines() const { return failed_; }
  const std::string& failure() const { return failure_; }

 private:
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  int fd_ = -1;
  std::string path_;
  int64_t failed_ = 0;
  std::string failure_;
};

}  // namespace keel::monitor
