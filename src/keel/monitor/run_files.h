// Reading a run folder's JSON-lines files (metrics.jsonl, events.jsonl) while the run appends to
// them: from a byte offset to the last complete line, so that a reader polling with the offset it
// was given never sees half a line and never reads a line twice.
#pragma once

#include <cstdint>
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
};

// A missing file, or one that is not a regular file, reads as no lines (a run that has not
// written it yet; a FIFO would block). `max_bytes` bounds one read (a large file comes in
// pieces); a line longer than that is skipped as a whole once its end is written.
LinesRead ReadLinesFrom(const std::string& path, uint64_t offset, size_t max_bytes = 8 << 20);

// Checks that `dir` is a keel run folder (it has metrics.jsonl or events.jsonl, as regular
// files); throws keel::Error (bad input) naming it otherwise. Returns the run's name (the
// folder's).
std::string CheckRunDir(const std::string& dir);

}  // namespace keel::monitor
