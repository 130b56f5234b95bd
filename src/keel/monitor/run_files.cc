#include "keel/monitor/run_files.h"

#include <filesystem>
#include <fstream>

#include "keel/core/error.h"

namespace keel::monitor {

LinesRead ReadLinesFrom(const std::string& path, uint64_t offset, size_t max_bytes) {
  LinesRead r;
  r.next = offset;
  std::ifstream in(path, std::ios::binary);
  if (!in) return r;
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  if (offset >= size) return r;
  std::string buf(size_t(std::min<uint64_t>(size - offset, max_bytes)), '\0');
  in.seekg(std::streamoff(offset));
  in.read(buf.data(), std::streamsize(buf.size()));
  buf.resize(size_t(in.gcount()));
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1)
    if (nl > start) r.lines.push_back(buf.substr(start, nl - start));
  r.next = offset + start;
  return r;
}

std::string CheckRunDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    ThrowBadInput(dir + ": no such folder (expected a run folder, e.g. runs/quickstart)");
  if (!fs::exists(fs::path(dir) / "metrics.jsonl", ec) &&
      !fs::exists(fs::path(dir) / "events.jsonl", ec))
    ThrowBadInput(dir +
                  ": no metrics.jsonl or events.jsonl: not a keel run folder (expected "
                  "the folder keel train writes, runs/NAME)");
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
  return name;
}

}  // namespace keel::monitor
