// The CPU backend: keel's kernels (oneDNN matrix products, OpenMP elsewhere) over host memory.
#pragma once

#include "keel/kernels/backend.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

const Backend& CpuBackend();

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS
