#include "keel/core/collective_progress.h"

#include <deque>
#include <mutex>
#include <utility>

namespace keel {
namespace {

struct Group {
  GroupProgress p;
  std::deque<std::pair<uint64_t, std::string>> waiting;  // issued, not done, oldest first
};

// Never destroyed: a comm thread left stuck in MPI at exit (parallel/mpi_engine.cc detaches it)
// may still note an operation done while the process's statics are torn down.
std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<Group>& Groups() {
  // A handful: world, dp, tp, pp, tied, and a pipeline's transfer streams.
  static auto* groups = new std::vector<Group>;
  return *groups;
}

Group& Find(const std::string& name) {
  for (Group& g : Groups())
    if (g.p.group == name) return g;
  Groups().push_back(Group{GroupProgress{name, 0, 0, ""}, {}});
  return Groups().back();
}

}  // namespace

uint64_t NoteIssued(const std::string& group, std::string op) {
  if (group.empty()) return 0;
  std::lock_guard lock(Mu());
  Group& g = Find(group);
  g.waiting.emplace_back(++g.p.issued, std::move(op));
  return g.p.issued;
}

void NoteDone(const std::string& group, uint64_t seq) {
  if (group.empty()) return;
  std::lock_guard lock(Mu());
  Group& g = Find(group);
  for (auto it = g.waiting.begin(); it != g.waiting.end(); ++it)
    if (it->first == seq) {
      g.waiting.erase(it);
      break;
    }
  // Done counts the prefix of finished ones: everything before the oldest still waiting.
  g.p.done = g.waiting.empty() ? g.p.issued : g.waiting.front().first - 1;
}

std::vector<GroupProgress> CollectiveProgress() {
  std::lock_guard lock(Mu());
  std::vector<GroupProgress> out;
  for (const Group& g : Groups()) {
    GroupProgress p = g.p;
    p.op = g.waiting.empty() ? "" : g.waiting.front().second;
    out.push_back(p);
  }
  return out;
}

}  // namespace keel
