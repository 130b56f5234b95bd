// The world communicator of the multi-process test binary (parallel_mpi_test), set by its main()
// in mpi_comm_main.cc for the cases in every file linked into it, and what those cases share.
#pragma once

#include <chrono>

#include "keel/parallel/comm.h"

namespace keel::parallel {

extern Comm* g_comm;

inline double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace keel::parallel
