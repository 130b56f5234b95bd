// The lost-peer path end to end, run by ctest as parallel_mpi_lost_peer under `mpirun -np 2`: rank
// 1 hangs without joining an all-reduce; rank 0's Wait with a deadline returns false, rank 0 drops
// its communicator and exits with kTempFail (75), as the trainer does. The test passes when the
// whole job ends with 75 within the ctest timeout, i.e. neither the destructor nor mpirun hangs on
// the stuck operation.
#include <chrono>
#include <cstdio>
#include <thread>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

int main() {
  auto comm = keel::parallel::MakeMpiComm();
  if (comm->rank() != 0) {
    // Hung, not dead: mpirun must end this rank once rank 0 has left.
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  float x = 1.0f;
  auto work = comm->AllReduceSumAsync(&x, 1);
  if (work->Wait(/*timeout_s=*/0.5)) {
    std::fprintf(stderr, "parallel_mpi_lost_peer: all-reduce completed without its peer\n");
    return 1;
  }
  std::fprintf(stderr, "parallel_mpi_lost_peer: timed out as expected; exiting with 75\n");
  comm.reset();  // must return although the all-reduce is still stuck
  return static_cast<int>(keel::ExitCode::kTempFail);
}
