// Every layout for a job, evaluated and ranked: memory, communication, time; the layouts that do
// not fit are kept with the reason.
//
//   keel::plan::Job job;  job.model = keel::plan::NamedModel("7B");  ...
//   auto all = keel::plan::Search(job, keel::plan::Constraints{});
//   all[0];  // the fastest layout that fits
#pragma once

#include <string>
#include <vector>

#include "keel/plan/checkpoint_interval.h"
#include "keel/plan/comm_time.h"
#include "keel/plan/memory.h"
#include "keel/plan/run_cost.h"

namespace keel::plan {

struct Estimate {
  Layout layout;
  MemoryBreakdown memory;
  CommVolume comm;
  StepTime time;
  CheckpointPlan ckpt;  // the same for every layout of a job (state and cluster do not change)
  RunCost cost;
  std::string activation_row;
  bool fits = false;
  std::string reason;  // why it does not fit; empty when it does
};

// Evaluates one layout; CheckLayout must already pass.
Estimate Evaluate(const Job& job, const Layout& l);

// Fixed values for the search; -1 (or an empty recompute list) leaves a dimension free.
struct Constraints {
  int tp = -1, pp = -1, dp = -1, zero = -1, micro_batch = -1;
  int sp = -1;             // 0 or 1
  int virtual_stages = 1;  // interleaved 1F1B chunks per pipeline rank (layouts with pp > 1)
  std::vector<Recompute> recompute;
  // Context parallelism: -1 searches cp > 1 for sequences of kCpSearchFrom tokens and more.
  int cp = -1;
  parallel::CpComm cp_comm = parallel::CpComm::kRing;
};

inline constexpr int kCpSearchFrom = 8192;

// All valid layouts within the constraints: fitting ones first, fastest (tokens/s) first, then
// the rejected ones by how far over memory they are. Throws bad input, one line with the
// numbers, when a fixed value makes every layout invalid (e.g. heads % tp).
std::vector<Estimate> Search(const Job& job, const Constraints& c);

// "tp=8 pp=2 dp=4 zero=1 mb=1 recompute=selective sp=on"
std::string LayoutName(const Layout& l);

}  // namespace keel::plan
