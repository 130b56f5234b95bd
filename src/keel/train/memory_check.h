// Before a run allocates anything large, what it will need per rank against what the machine has:
// a size that cannot fit (a batch of 10⁹ sequences, 10⁸ layers, a prefetch queue of 10⁸
// micro-batches) is refused at once with exit 2, naming the largest items, rather than dying in
// std::bad_alloc, growing until the kernel's OOM killer ends it, or building a parameter table
// of 10⁹ entries first.
//
// The figures are those of the busiest pipeline stage's rank, by the formulas its buffers are
// allocated with and `keel plan --accounting keel` prints: parallel::StateBytesPerRank over the
// stage's parameter layout (model::StateShapeOf, sized without building a table per layer: a
// Llama's untied lm_head counts), and keel's activation plan itself; plus the prefetch queue, the
// classifier's logit tile and the whole fp32 initial copy the state is set from. They are checked
// against MemAvailable from /proc/meminfo, shared by the ranks that run on this machine; so is the
// end of the run, where every rank gathers the whole model in fp32 for the model file and the
// samples (a LoRA run over a large base: far more than it trains with).
//
//   CheckMemoryFits(cfg, ResolveLayout(cfg, world));   // throws keel::Error (bad input)
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "keel/parallel/layout.h"
#include "keel/parallel/state_bytes.h"
#include "keel/train/config.h"

namespace keel::train {

// The state's dtypes, master and offload tier as the config sets them.
parallel::StateTiers TiersOf(const RunConfig& cfg);

// (what, bytes) per rank, largest first, for the run's model (`cfg`) on `layout` (its stages,
// sequence parallelism and micro-batches). Throws keel::Error (bad input) for a model wider than
// keel's tensor shapes (int) can hold.
std::vector<std::pair<std::string, double>> RunMemoryItems(const RunConfig& cfg,
                                                           const parallel::Layout& layout);

// Throws keel::Error (bad input) when the items exceed `available` bytes (default: MemAvailable
// divided by the ranks on this machine, $OMPI_COMM_WORLD_LOCAL_SIZE).
void CheckMemoryFits(const RunConfig& cfg, const parallel::Layout& layout, double available = -1);

// Whether a LoRA run's frozen base is set a tensor at a time, never whole in fp32: drawn from the
// seed, or read from [model] init_from where that is a keel model file or an HF Llama folder (an
// HF GPT-2 file, or [model] init_adapter's merge, takes the whole model).
bool LoraBaseStreams(const RunConfig& cfg);

}  // namespace keel::train
