// An append-only JSON-lines file (metrics.jsonl, events.jsonl): one object per line, flushed per
// line so that a crash loses at most the line being written.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace keel::monitor {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path);  // throws keel::Error if it cannot open
  JsonlWriter(JsonlWriter&& o) noexcept : f_(o.f_) { o.f_ = nullptr; }
  JsonlWriter& operator=(JsonlWriter&& o) noexcept {
    std::swap(f_, o.f_);
    return *this;
  }
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter();

  void Write(const nlohmann::json& obj);
  bool is_open() const { return f_ != nullptr; }

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace keel::monitor
