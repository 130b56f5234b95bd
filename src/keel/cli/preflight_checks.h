// The checks of `keel preflight`, one function each. Every rank runs every check in the same
// order (they gather per-rank figures over the communicator); each returns one row of the go /
// no-go table with what was measured, what the plan expects and the verdict with its reason.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "keel/core/dtype.h"
#include "keel/model/activations.h"
#include "keel/model/config.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/state_bytes.h"

namespace keel::cli::preflight {

struct Row {
  std::string check;
  std::string measured;
  std::string expected;
  std::string verdict;  // "go", "warn" (runs, but not as planned), "no-go", "skip"
  std::string reason;
  nlohmann::json data = nlohmann::json::object();  // the numbers behind the strings
};

struct Context {
  parallel::Comm* comm = nullptr;
  model::ModelConfig model;
  std::string model_name;
  DType dtype = DType::kBF16;
  model::Recompute recompute = model::Recompute::kNone;
  int micro_batch = 1, seq = 256, global_batch = 8, threads = 1;
  double bucket_bytes = 25 << 20;
  std::string ckpt_dir;     // where the checkpoint round trip writes
  std::string data_path;    // "" = no data check
  std::string offload_dir;  // [offload] dir; "" = no offload check
  double offload_chunk = 16 << 20;
  parallel::StateTiers tiers;  // what the tier holds (train::TiersOf)
  double node_mtbf_hours = 6000;
  double efficiency = -1;  // not given: plan::DefaultEfficiency of this-cpu for the precision
  bool quick = false;
  // Filled by the checks, for the ones after them (median over ranks, FLOP/s and bytes/s).
  double matmul_flops = 0;  // in the run's precision
  double step_s = 0;        // one micro-batch's optimizer step, slowest rank
  double copy_bytes_per_s = 0;
};

Row CheckSoftware(Context& c);
Row CheckMatmul(Context& c, DType dtype);
Row CheckStep(Context& c);
Row CheckMemoryBandwidth(Context& c);
Row CheckMemory(Context& c);
Row CheckCheckpoint(Context& c);
Row CheckData(Context& c);
Row CheckOffload(Context& c);
Row CheckAllReduce(Context& c);

}  // namespace keel::cli::preflight
