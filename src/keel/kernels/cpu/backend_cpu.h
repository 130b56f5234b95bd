// The CPU backend: keel's kernels (oneDNN matrix products, OpenMP elsewhere) over host memory.
#pragma once

#include "keel/kernels/backend.h"

namespace keel::kernels::cpu {

const Backend& CpuBackend();

}  // namespace keel::kernels::cpu
