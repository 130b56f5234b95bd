#include "keel/monitor/run_files.h"

#include <filesystem>
#include <fstream>
#include <string_view>

#include "keel/core/error.h"
#include "keel/core/validate.h"

namespace keel::monitor {

LinesRead ReadLinesFrom(const std::string& path, uint64_t offset, size_t max_bytes) {
  LinesRead r;
  r.next = offset;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return r;
  std::ifstream in(path, std::ios::binary);
  if (!in) return r;
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  if (offset > 0) {
    char before = 0;
    if (offset <= size) {
      in.seekg(std::streamoff(offset - 1));
      in.get(before);
    }
    if (before != '\n') {
      r.reset = true;
      r.next = offset = 0;
      in.clear();
    }
  }
  if (offset >= size) return r;
  std::string buf(size_t(std::min<uint64_t>(size - offset, max_bytes)), '\0');
  in.seekg(std::streamoff(offset));
  in.read(buf.data(), std::streamsize(buf.size()));
  buf.resize(size_t(in.gcount()));
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (nl - start > kMaxLineBytes)
      ++r.skipped;
    else if (nl > start)
      r.lines.push_back(buf.substr(start, nl - start));
  }
  r.next = offset + start;
  if (start > 0 || buf.size() < max_bytes) return r;
  // The whole read is one line without its end: skip to the end, once it is written.
  std::string piece(1 << 20, '\0');
  for (uint64_t at = offset + buf.size(); at < size;) {
    in.seekg(std::streamoff(at));
    in.read(piece.data(), std::streamsize(piece.size()));
    const size_t got = size_t(in.gcount());
    if (got == 0) break;
    const size_t nl = std::string_view(piece.data(), got).find('\n');
    if (nl != std::string_view::npos) {
      r.next = at + nl + 1;
      ++r.skipped;
      break;
    }
    at += got;
  }
  return r;
}

nlohmann::json ParseJsonLines(const std::vector<std::string>& lines, size_t* damaged) {
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& l : lines) {
    nlohmann::json j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (j.is_object())
      out.push_back(std::move(j));
    else
      ++*damaged;
  }
  return out;
}

std::string CheckRunDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    ThrowBadInput(dir + ": no such folder (expected a run folder, e.g. runs/quickstart)");
  bool found = false;
  for (const char* file : {"metrics.jsonl", "events.jsonl"}) {
    const std::string path = (fs::path(dir) / file).string();
    if (!fs::exists(fs::symlink_status(path, ec))) continue;
    CheckRegularFile(path);  // a FIFO would block every reader
    found = true;
  }
  if (!found)
    ThrowBadInput(dir +
                  ": no metrics.jsonl or events.jsonl: not a keel run folder (expected "
                  "the folder keel train writes, runs/NAME)");
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
  return name;
}

}  // namespace keel::monitor
