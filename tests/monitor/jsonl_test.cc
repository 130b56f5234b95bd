// JSON-lines files, written and read while written: JsonlWriter (monitor/jsonl.h) cuts a line it
// cannot write whole back off, and only that line (another writer's lines in the same file, the
// supervisor's and rank 0's in events.jsonl, stay); ReadLinesFrom (monitor/run_files.h) starts
// again from the top of a file rewritten under its reader.
#include "keel/monitor/jsonl.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <string>

#include "data/temp_dir.h"
#include "keel/core/file_util.h"
#include "keel/monitor/run_files.h"

namespace keel::monitor {
namespace {

TEST(JsonlWriter, AFailedLineIsCutWithoutTheOtherWritersLines) {
  data::TempDir dir;
  const std::string path = dir / "events.jsonl";
  JsonlWriter a(path), b(path);
  a.Write({{"event", "start"}});
  b.Write({{"event", "supervisor"}});
  const std::string whole = ReadWholeFile(path);
  // The file may grow 10 bytes more: a's next line is written in part, then fails (EFBIG).
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit low = old;
  low.rlim_cur = whole.size() + 10;
  auto* const was = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &low), 0);
  a.Write({{"event", "failure"}, {"message", std::string(100, 'x')}});
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, was);
  EXPECT_EQ(a.failed_lines(), 1);
  EXPECT_EQ(b.failed_lines(), 0);
  EXPECT_EQ(ReadWholeFile(path), whole);  // both earlier lines, and no part of the failed one
  a.Write({{"event", "after"}});
  EXPECT_EQ(ReadWholeFile(path), whole + "{\"event\":\"after\"}\n");
  // Opened again on a file replaced under it (a rollback's metrics.jsonl): it writes to the new
  // file and still counts the line it lost.
  WriteFileAtomic(path, "{\"step\":1}\n");
  a.Reopen();
  a.Write({{"step", 2}});
  EXPECT_EQ(ReadWholeFile(path), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(a.failed_lines(), 1);
}

// A resumed run keeps its metrics up to the checkpoint's step (a shorter file, then new steps):
// a reader's offset into the old file is past the end, or lands mid-line once the file regrows.
// Either way it reads the file again from the start, told so, instead of nothing (or half a
// line's tail) until the file passes the old offset.
TEST(ReadLinesFrom, StartsAgainInAFileRewrittenUnderIt) {
  data::TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  WriteFileAtomic(path,
                  "{\"step\":1,\"loss\":4.25}\n{\"step\":2,\"loss\":4.125}\n"
                  "{\"step\":3,\"loss\":4.0625}\n");
  const LinesRead first = ReadLinesFrom(path, 0);
  ASSERT_EQ(first.lines.size(), 3u);
  EXPECT_FALSE(first.reset);
  EXPECT_TRUE(ReadLinesFrom(path, first.next).lines.empty());  // nothing new, no reset
  EXPECT_FALSE(ReadLinesFrom(path, first.next).reset);
  WriteFileAtomic(path, "{\"step\":1,\"loss\":4.25}\n");  // rolled back to step 1
  const LinesRead shorter = ReadLinesFrom(path, first.next);
  EXPECT_TRUE(shorter.reset);
  EXPECT_EQ(shorter.lines, std::vector<std::string>{"{\"step\":1,\"loss\":4.25}"});
  WriteFileAtomic(path,
                  "{\"step\":1,\"loss\":4.25}\n{\"step\":2,\"loss\":4.5}\n"
                  "{\"step\":3,\"loss\":4.375}\n{\"step\":4,\"loss\":4.3}\n");
  const LinesRead regrown = ReadLinesFrom(path, first.next);
  EXPECT_TRUE(regrown.reset);
  EXPECT_EQ(regrown.lines.size(), 4u);
  size_t damaged = 0;
  EXPECT_EQ(ParseJsonLines(regrown.lines, &damaged).size(), 4u);
  EXPECT_EQ(damaged, 0u);
}

}  // namespace
}  // namespace keel::monitor
