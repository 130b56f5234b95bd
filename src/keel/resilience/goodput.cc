#include "keel/resilience/goodput.h"

#include <algorithm>
#include <cstdio>

namespace keel::resilience {

Goodput Account(const std::vector<Attempt>& attempts, double wall_start, double wall_end) {
  Goodput g;
  g.wall_s = wall_end - wall_start;
  double trained = 0;
  for (size_t i = 0; i < attempts.size(); ++i) {
    const Attempt& a = attempts[i];
    if (i > 0) ++g.restarts;
    const bool looped = a.start_step >= 0 && a.loop_start > 0;
    if (looped)
      g.startup_s += a.loop_start - a.spawn;
    else if (a.end > 0)
      g.startup_s += a.end - a.spawn;
    const int steps = looped ? a.end_step - a.start_step : 0;
    if (steps > 0 && a.last_step_end > a.loop_start) {
      const double t = a.last_step_end - a.loop_start;
      trained += t;
      // Steps past the checkpoint the next start to train resumed from were trained for nothing
      // (a start that died in its setup resumed nothing in between).
      size_t next = i + 1;
      while (next < attempts.size() && attempts[next].start_step < 0) ++next;
      if (next < attempts.size()) {
        const int lost = std::clamp(a.end_step - attempts[next].start_step, 0, steps);
        g.recompute_s += t * lost / steps;
      }
    }
    const bool failed = a.outcome.rfind("failed", 0) == 0;
    if (failed && a.end > 0 && looped) {
      const double progress = std::max({a.spawn, a.loop_start, a.last_step_end});
      g.detect_s += std::max(0.0, a.end - progress);
    }
    if (a.next_spawn > 0 && a.end > 0) g.restart_s += a.next_spawn - a.end;
  }
  g.useful_s = trained - g.recompute_s;
  g.other_s =
      std::max(0.0, g.wall_s - g.useful_s - g.recompute_s - g.detect_s - g.restart_s - g.startup_s);
  return g;
}

nlohmann::json Goodput::ToJson() const {
  return {{"wall_s", wall_s},     {"useful_s", useful_s},   {"recompute_s", recompute_s},
          {"detect_s", detect_s}, {"restart_s", restart_s}, {"startup_s", startup_s},
          {"other_s", other_s},   {"restarts", restarts},   {"goodput", goodput()}};
}

std::string Goodput::Text() const {
  char buf[512];
  auto pct = [&](double s) { return wall_s > 0 ? 100 * s / wall_s : 0.0; };
  std::snprintf(buf, sizeof buf,
                "goodput %.1f%% of %.1f s wall, %d restart(s): training %.1f s; lost: recomputed "
                "steps %.1f s (%.1f%%), steps cut short and noticing the failure %.1f s (%.1f%%), "
                "restarting %.1f s "
                "(%.1f%%), starting up and loading checkpoints %.1f s (%.1f%%), other %.1f s "
                "(%.1f%%)",
                100 * goodput(), wall_s, restarts, useful_s, recompute_s, pct(recompute_s),
                detect_s, pct(detect_s), restart_s, pct(restart_s), startup_s, pct(startup_s),
                other_s, pct(other_s));
  return buf;
}

}  // namespace keel::resilience
