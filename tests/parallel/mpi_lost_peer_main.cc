// The lost-peer path end to end, run by ctest as parallel_mpi_lost_peer under `mpirun -np 2`: rank
// 1 hangs without joining an all-reduce; rank 0's Wait with a deadline returns false, rank 0 drops
// its communicator and exits with kTempFail (75), as the trainer does. The test passes when the
// whole job ends with 75 within the ctest timeout, i.e. neither the destructor nor mpirun hangs on
// the stuck operation.
//
// Meanwhile rank 0 must not spin: past the engine's first second of hot polling, its waiting comm
// thread naps (mpi_engine.cc), so the process uses little CPU. Both ways of waiting are checked:
// a small all-reduce (its nonblocking form), which rank 1 joins late, then a large one (a barrier
// before the blocking call), which it never joins.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

namespace {

double CpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Waits 1.5 s (the hot polling) and then 1.5 s more, measuring the CPU of the second; false when
// `work` completed meanwhile or the process used more than a third of a core.
bool WaitsQuietly(keel::parallel::Work& work, const char* what) {
  if (work.Wait(1.5)) {
    std::fprintf(stderr, "parallel_mpi_lost_peer: %s completed without its peer\n", what);
    return false;
  }
  const double cpu0 = CpuSeconds();
  if (work.Wait(1.5)) {
    std::fprintf(stderr, "parallel_mpi_lost_peer: %s completed without its peer\n", what);
    return false;
  }
  // A spinning comm thread would use ~1.5 s of CPU in those 1.5 s.
  const double used = CpuSeconds() - cpu0;
  std::fprintf(stderr, "parallel_mpi_lost_peer: %s: %.2f s of CPU in 1.5 s of waiting\n", what,
               used);
  if (used > 0.5) std::fprintf(stderr, "parallel_mpi_lost_peer: the waiting rank spins\n");
  return used <= 0.5;
}

}  // namespace

int main() {
  auto comm = keel::parallel::MakeMpiComm();
  float one = 1.0f;
  if (comm->rank() != 0) {
    // Late for the small all-reduce (rank 0 has waited 3 s by then), then hung, not dead: mpirun
    // must end this rank once rank 0 has left.
    std::this_thread::sleep_for(std::chrono::milliseconds(4500));
    comm->AllReduceSum(&one, 1);
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  auto small = comm->AllReduceSumAsync(&one, 1);
  if (!WaitsQuietly(*small, "small all-reduce")) return 1;
  if (!small->Wait(60) || one != 2.0f) {
    std::fprintf(stderr, "parallel_mpi_lost_peer: the late peer's all-reduce gave %g\n", one);
    return 1;
  }
  // 1 MiB: above the size where the engine waits in a barrier before the blocking collective.
  std::vector<float> x(size_t{1} << 18, 1.0f);
  auto large = comm->AllReduceSumAsync(x.data(), x.size());
  if (!WaitsQuietly(*large, "large all-reduce")) return 1;
  std::fprintf(stderr, "parallel_mpi_lost_peer: timed out as expected; exiting with 75\n");
  comm.reset();  // must return although the all-reduce is still stuck
  return static_cast<int>(keel::ExitCode::kTempFail);
}
