// Reading a run folder's JSON-lines files (metrics.jsonl, events.jsonl) while the run appends to
// them: from a byte offset to the last complete line, so that a reader polling with the offset it
// was given never sees half a line and never reads a line twice.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace keel::monitor {

// A line longer than this is not one keel wrote (a metrics line is about 1 KB): it is skipped and
// counted, so that one damaged line cannot stall every reader behind it.
constexpr size_t kMaxLineBytes = 1 << 20;

struct LinesRead {
  std::vector<std::string> lines;  // complete lines, without their newline
  uint64_t next = 0;               // the offset to read from next time
  size_t skipped = 0;              // complete lines over kMaxLineBytes, left out
  bool reset = false;              // the file was rewritten: `lines` are its lines from the start
};

// A missing file, or one that is not a regular file, reads as no lines (a run that has not
// written it yet; a FIFO would block). `max_bytes` bounds one read (a large file comes in
// pieces); a line longer than that is skipped as a whole once its end is written. An offset past
// the end, or not just after a line's end, is one of a file since rewritten (a resumed or
// rolled-back run keeps its metrics up to the checkpoint's step): it reads from 0, with `reset`.
LinesRead ReadLinesFrom(const std::string& path, uint64_t offset, size_t max_bytes = 8 << 20);

// The lines that are JSON objects, parsed; the others (a line damaged by a crash mid-write, or a
// resumed run's first line appended to it) are counted in *damaged and left out.
nlohmann::json ParseJsonLines(const std::vector<std::string>& lines, size_t* damaged);

// Checks that `dir` is a keel run folder (it has metrics.jsonl or events.jsonl, as regular
// files); throws keel::Error (bad input) naming it otherwise. Returns the run's name (the
// folder's).
std::string CheckRunDir(const std::string& dir);

}  // namespace keel::monitor
