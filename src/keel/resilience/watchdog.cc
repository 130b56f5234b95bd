#include "keel/resilience/watchdog.h"

#include <algorithm>
#include <cstdio>

namespace keel::resilience {

int PhaseOrder(const std::string& phase) {
  static const char* kOrder[] = {"train",     "data",       "forward", "backward",
                                 "optimizer", "checkpoint", "validate"};
  for (int i = 0; i < int(std::size(kOrder)); ++i)
    if (phase == kOrder[i]) return i;
  return -1;  // setup, resume, final, exit: not inside a step
}

std::vector<int> StuckRanks(const std::vector<Heartbeat>& beats) {
  std::vector<int> stuck;
  if (beats.empty()) return stuck;
  auto key = [](const Heartbeat& b) { return std::pair{b.step, PhaseOrder(b.phase)}; };
  auto least = key(beats[0]), most = key(beats[0]);
  for (const Heartbeat& b : beats) least = std::min(least, key(b)), most = std::max(most, key(b));
  if (least == most) return stuck;
  for (const Heartbeat& b : beats)
    if (key(b) == least) stuck.push_back(b.rank);
  return stuck;
}

std::string DescribeStuck(const std::vector<Heartbeat>& beats, const std::vector<int>& stuck) {
  std::string out;
  const double now = UnixNow();
  for (const Heartbeat& b : beats) {
    if (std::find(stuck.begin(), stuck.end(), b.rank) == stuck.end()) continue;
    char line[320];
    std::snprintf(line, sizeof line,
                  "rank %d on %s (pid %lld) is stuck in step %d, phase %s (its last beat %.1f s "
                  "ago)",
                  b.rank, b.host.c_str(), static_cast<long long>(b.pid), b.step + 1,
                  b.phase.c_str(), now - b.time);
    out += (out.empty() ? "" : "; ") + std::string(line);
  }
  return out;
}

std::string DescribeWait(int me, const std::vector<GroupProgress>& mine,
                         const std::vector<Heartbeat>& beats) {
  std::string first;  // a wait with no peer behind, said only if no group has one
  for (const GroupProgress& g : mine) {
    if (g.issued <= g.done) continue;
    const uint64_t seq = g.done + 1;
    const std::string where = "rank " + std::to_string(me) + " waits in " + g.group + " " + g.op +
                              " #" + std::to_string(seq);
    std::string behind;
    for (const Heartbeat& b : beats) {
      if (b.rank == me) continue;
      for (const GroupProgress& p : b.collectives) {
        if (p.group != g.group || p.issued >= seq) continue;
        behind +=
            (behind.empty() ? "" : "; ") +
            ("rank " + std::to_string(b.rank) + " on " + b.host + " (pid " + std::to_string(b.pid) +
             ") has not issued it (it is at #" + std::to_string(p.issued) + ", in step " +
             std::to_string(b.step + 1) + ", phase " + b.phase + ")");
      }
    }
    if (!behind.empty()) return where + ": " + behind;
    if (first.empty())
      first = where +
              ", which every peer's last beat has issued (stuck inside MPI, or a peer "
              "that is gone)";
  }
  return first;
}

HangWatchdog::HangWatchdog(double timeout_s, std::string heartbeat_dir, int rank, OnHang on_hang)
    : timeout_s_(timeout_s),
      dir_(std::move(heartbeat_dir)),
      rank_(rank),
      on_hang_(std::move(on_hang)) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { Loop(); });
}

HangWatchdog::~HangWatchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HangWatchdog::Arm(int step) {
  std::lock_guard lock(mu_);
  armed_ = true;
  step_ = step;
  since_ = UnixNow();
}

void HangWatchdog::Disarm() {
  std::lock_guard lock(mu_);
  armed_ = false;
}

void HangWatchdog::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stop_ || !armed_ || UnixNow() - since_ < timeout_s_) continue;
    const int step = step_;
    const double waited = UnixNow() - since_;
    armed_ = false;
    lock.unlock();
    char head[200];
    std::snprintf(head, sizeof head,
                  "hang: step %d has not finished after %.0f s ([resilience] hang_timeout_s = %g)",
                  step + 1, waited, timeout_s_);
    std::string line = head;
    bool self = false;
    if (dir_.empty()) {
      line += "; run under keel launch for heartbeats that name the stuck rank";
    } else {
      const std::vector<Heartbeat> beats = ReadHeartbeats(dir_);
      const std::vector<int> stuck = StuckRanks(beats);
      const std::string wait = DescribeWait(rank_, CollectiveProgress(), beats);
      // A waiting rank names the stuck ones too: the job ends when its first rank exits, which
      // may be this one, before the stuck rank's own watchdog has said where it is.
      if (!wait.empty() && std::find(stuck.begin(), stuck.end(), rank_) == stuck.end())
        line += ": " + (stuck.empty() ? "" : DescribeStuck(beats, stuck) + "; ") + wait;
      else if (stuck.empty())
        line += "; every rank's heartbeat is at the same step and phase (stuck inside MPI?)";
      else
        line += ": " + DescribeStuck(beats, stuck) +
                (std::find(stuck.begin(), stuck.end(), rank_) != stuck.end()
                     ? " [this rank]"
                     : "; rank " + std::to_string(rank_) + " waits for it");
      // The stuck rank leaves last, so that the others still read where it is, not its exit.
      self = std::find(stuck.begin(), stuck.end(), rank_) != stuck.end();
      if (self) std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    on_hang_(line, self);
    lock.lock();
  }
}

}  // namespace keel::resilience
