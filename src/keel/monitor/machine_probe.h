// This machine's memory, measured: its copy rate and its size. `keel plan --accelerator this-cpu`
// and `keel preflight` use them beside the arithmetic rates (core/cpu_rates.h).
//
//   double bytes_per_s = keel::monitor::MeasureCopyRate(/*threads=*/2, size_t(128) << 20, 3);
#pragma once

#include <cstddef>

namespace keel::monitor {

// Bytes memcpy moves per second (each byte read once and written once), `threads` threads each
// copying its share of a `bytes` buffer, best of `reps`.
double MeasureCopyRate(int threads, size_t bytes, int reps);

// MemTotal from /proc/meminfo, in bytes; 0 if it cannot be read (MemAvailable: core/validate.h).
double MemTotalBytes();

}  // namespace keel::monitor
