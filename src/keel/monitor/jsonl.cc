#include "keel/monitor/jsonl.h"

#include <cerrno>
#include <cstring>

#include "keel/core/error.h"

namespace keel::monitor {

JsonlWriter::JsonlWriter(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {
  if (!f_) ThrowRuntime("open " + path + ": " + std::strerror(errno));
}

JsonlWriter::~JsonlWriter() {
  if (f_) std::fclose(f_);
}

void JsonlWriter::Write(const nlohmann::json& obj) {
  if (!f_) return;
  std::string line = obj.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

}  // namespace keel::monitor
