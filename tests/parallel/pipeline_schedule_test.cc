#include "keel/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

namespace keel::parallel {
namespace {

TEST(PipelineSchedule, OneF1BWarmsUpThenAlternatesThenDrains) {
  // Stage 0 of 4, 6 micro-batches: 3 warm-up forwards, then F/B pairs, then 3 backwards.
  const std::vector<PipeUnit> u = PipelineUnits(4, 0, 1, 6);
  ASSERT_EQ(u.size(), 12u);
  std::string order;
  for (const PipeUnit& x : u) order += (x.forward ? "F" : "B") + std::to_string(x.micro) + " ";
  EXPECT_EQ(order, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(PipelineSlots(4, 0, 1, 6), std::vector<int>{4});
  EXPECT_EQ(PipelineSlots(4, 3, 1, 6), std::vector<int>{1});  // the last stage: F, B, F, B
  EXPECT_EQ(PipelineSlots(4, 0, 1, 2), std::vector<int>{2});  // fewer micro-batches than stages
}

TEST(PipelineSchedule, InterleavedTakesTheChunksInTurnGroupsOfPMicroBatches) {
  // Stage 1 of 2, 2 chunks, 4 micro-batches: warm-up (2-1-1)*2 + (2-1)*2 = 2 forwards.
  std::string order;
  for (const PipeUnit& x : PipelineUnits(2, 1, 2, 4))
    order +=
        (x.forward ? "F" : "B") + std::to_string(x.chunk) + "." + std::to_string(x.micro) + " ";
  EXPECT_EQ(order,
            "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3 ");
  EXPECT_DOUBLE_EQ(PipelineBubble(4, 8), 3.0 / 11);
  EXPECT_DOUBLE_EQ(PipelineBubble(4, 8, 2), 3.0 / 22);
}

// Runs every rank's schedule against the data dependencies (a forward needs the previous virtual
// stage's forward of that micro-batch; a backward needs the next one's backward and its own
// forward): the schedule must finish, with every unit once and never more micro-batches in
// flight per chunk than PipelineSlots says.
TEST(PipelineSchedule, EveryLayoutCompletesWithoutDeadlockWithinItsSlots) {
  for (int p : {1, 2, 3, 4})
    for (int v : {1, 2, 3})
      for (int m = p; m <= 8; m += (v > 1 ? p : 1)) {
        if (v > 1 && p == 1) continue;
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " +
                     std::to_string(m));
        std::vector<std::vector<PipeUnit>> units;
        std::vector<std::vector<int>> slots;
        for (int s = 0; s < p; ++s) {
          units.push_back(PipelineUnits(p, s, v, m));
          slots.push_back(PipelineSlots(p, s, v, m));
          ASSERT_EQ(units.back().size(), size_t(2 * m * v));
        }
        const int V = p * v;
        std::map<std::tuple<bool, int, int>, bool> done;  // (forward, virtual stage, micro)
        std::vector<size_t> next(size_t(p), 0);
        std::vector<std::vector<int>> live(size_t(p), std::vector<int>(size_t(v), 0));
        bool progress = true;
        while (progress) {
          progress = false;
          for (int s = 0; s < p; ++s) {
            if (next[size_t(s)] == units[size_t(s)].size()) continue;
            const PipeUnit& u = units[size_t(s)][next[size_t(s)]];
            const int vs = u.chunk * p + s;
            const bool ready = u.forward ? (vs == 0 || done[{true, vs - 1, u.micro}])
                                         : (done[{true, vs, u.micro}] &&
                                            (vs == V - 1 || done[{false, vs + 1, u.micro}]));
            if (!ready) continue;
            bool& ran = done[std::make_tuple(u.forward, vs, u.micro)];
            ASSERT_FALSE(ran) << "a unit runs twice";
            ran = true;
            int& n = live[size_t(s)][size_t(u.chunk)];
            n += u.forward ? 1 : -1;
            ASSERT_LE(n, slots[size_t(s)][size_t(u.chunk)]);
            ++next[size_t(s)];
            progress = true;
          }
        }
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(next[size_t(s)], units[size_t(s)].size()) << "stage " << s << " is stuck";
        // The slots in closed form: 1F1B keeps min(p - s, m); the last virtual stage runs each
        // backward right after its forward (its head buffers exist once).
        for (int s = 0; s < p; ++s) {
          if (v == 1) {
            EXPECT_EQ(slots[size_t(s)][0], std::min(p - s, m)) << "stage " << s;
          }
        }
        EXPECT_EQ(slots[size_t(p - 1)][size_t(v - 1)], 1);
      }
}

}  // namespace
}  // namespace keel::parallel
