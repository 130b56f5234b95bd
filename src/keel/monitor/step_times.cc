#include "keel/monitor/step_times.h"

#include <cstdio>

namespace keel::monitor {
namespace {

struct PhaseNames {
  const char* key;
  const char* name;
  const char* brief;  // the step line's
};
constexpr PhaseNames kNames[kPhases] = {
    {"data_ms", "data", "data"},           {"forward_ms", "forward", "fwd"},
    {"head_ms", "head", "head"},           {"backward_ms", "backward", "bwd"},
    {"dp_wait_ms", "dp_wait", "dp"},       {"tp_wait_ms", "tp_wait", "tp"},
    {"cp_wait_ms", "cp_wait", "cp"},       {"pp_wait_ms", "pp_wait", "pp"},
    {"tied_wait_ms", "tied_wait", "tied"}, {"sync_wait_ms", "sync_wait", "sync"},
    {"optim_ms", "optimizer", "opt"},      {"ckpt_ms", "checkpoint", "ckpt"},
    {"checks_ms", "checks", "chk"},        {"val_ms", "validation", "val"},
    {"other_ms", "other", "other"},
};

}  // namespace

const char* PhaseKey(Phase p) { return kNames[size_t(p)].key; }
const char* PhaseName(Phase p) { return kNames[size_t(p)].name; }

void StepTimes::CloseWith(double total_ms) {
  (*this)[Phase::kOther] = 0;
  (*this)[Phase::kOther] = total_ms - Sum();
}

double StepTimes::Sum() const {
  double s = 0;
  for (double v : ms) s += v;
  return s;
}

std::string ShareLine(const StepTimes& t, double total_ms) {
  std::string line;
  if (total_ms <= 0) return line;
  for (size_t i = 0; i < kPhases; ++i) {
    const double pct = 100 * t.ms[i] / total_ms;
    if (pct < 1) continue;
    char part[32];
    std::snprintf(part, sizeof part, "%s %s %.0f%%", line.empty() ? " |" : "", kNames[i].brief,
                  pct);
    line += part;
  }
  return line;
}

}  // namespace keel::monitor
