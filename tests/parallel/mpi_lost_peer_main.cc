// The lost-peer path end to end, run by ctest as parallel_mpi_lost_peer under `mpirun -np 2`: rank
// 1 hangs without joining an all-reduce; rank 0's Wait with a deadline returns false, rank 0 drops
// its communicator and exits with kTempFail (75), as the trainer does. The test passes when the
// whole job ends with 75 within the ctest timeout, i.e. neither the destructor nor mpirun hangs on
// the stuck operation. Meanwhile rank 0 must not spin: past the engine's first second of hot
// polling, its waiting comm thread naps (mpi_engine.cc), so the process uses little CPU.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

int main() {
  auto comm = keel::parallel::MakeMpiComm();
  if (comm->rank() != 0) {
    // Hung, not dead: mpirun must end this rank once rank 0 has left.
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  // 1 MiB: above the size where the engine waits in a barrier before the blocking collective.
  std::vector<float> x(size_t{1} << 18, 1.0f);
  auto work = comm->AllReduceSumAsync(x.data(), x.size());
  auto cpu_s = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  double cpu0 = 0;
  for (double wait_s : {1.5, 2.0}) {
    if (work->Wait(wait_s)) {
      std::fprintf(stderr, "parallel_mpi_lost_peer: all-reduce completed without its peer\n");
      return 1;
    }
    if (cpu0 == 0) cpu0 = cpu_s();
  }
  // A spinning comm thread would use ~2 s of CPU in those 2 s.
  const double used = cpu_s() - cpu0;
  std::fprintf(stderr, "parallel_mpi_lost_peer: %.2f s of CPU in 2 s of waiting\n", used);
  if (used > 0.5) {
    std::fprintf(stderr, "parallel_mpi_lost_peer: the waiting rank spins\n");
    return 1;
  }
  std::fprintf(stderr, "parallel_mpi_lost_peer: timed out as expected; exiting with 75\n");
  comm.reset();  // must return although the all-reduce is still stuck
  return static_cast<int>(keel::ExitCode::kTempFail);
}
