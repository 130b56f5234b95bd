// What every communicator shares: the blocking conveniences written once over the virtual
// operations, and CreateComm(), which picks the implementation from how the process was started.
#include "keel/parallel/comm.h"

#include <cstdlib>
#include <string>

#include "keel/core/error.h"
#include "keel/core/plugin.h"
#include "keel/parallel/comm_wait.h"

namespace keel::parallel {
namespace {

// Reads a positive integer from the environment; 0 when unset, empty or not a number.
long EnvSize(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x > 0) ? x : 0;
}

}  // namespace

void Comm::AllReduceSum(float* data, size_t n) {
  auto work = AllReduceSumAsync(data, n);
  WaitOrLostDefault(*work);
}

double Comm::AllReduceSum(double x) {
  AllReduceDoubles(&x, 1, /*max=*/false);
  return x;
}

double Comm::AllReduceMax(double x) {
  AllReduceDoubles(&x, 1, /*max=*/true);
  return x;
}

void Comm::AllReduceSum(double* data, size_t n) { AllReduceDoubles(data, n, /*max=*/false); }

void Comm::AllReduceMax(double* data, size_t n) { AllReduceDoubles(data, n, /*max=*/true); }

void Comm::BroadcastString(std::string& s, int root) {
  uint64_t n = s.size();
  Broadcast(&n, sizeof n, root);
  s.resize(n);
  if (n) Broadcast(s.data(), n, root);
}

std::unique_ptr<Comm> CreateComm() {
  // KEEL_COMM=local|mpi overrides the guess, e.g. to exercise the MPI path with one process.
  if (const char* forced = std::getenv("KEEL_COMM"); forced != nullptr && *forced != '\0') {
    const std::string f = forced;
    if (f == "local") return MakeLocalComm();
    if (f == "mpi") return MakeMpiComm();
    ThrowBadInput("environment KEEL_COMM: expected \"local\" or \"mpi\", got \"" + f + "\"");
  }
  // The launcher tells us the world size before MPI is initialized: OpenMPI's mpirun sets
  // OMPI_COMM_WORLD_SIZE, MPICH/Hydra and Slurm's PMI2 set PMI_SIZE. A size of 1 stays local:
  // initializing MPI for one rank costs startup time and buys nothing.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (long n = EnvSize(var); n > 0) return n > 1 ? MakeMpiComm() : MakeLocalComm();
  }
  // A PMIx launch (srun --mpi=pmix) sets PMIX_RANK but no portable size; Slurm says how many tasks.
  if (std::getenv("PMIX_RANK") != nullptr) {
    long n = EnvSize("SLURM_NTASKS");
    return n == 1 ? MakeLocalComm() : MakeMpiComm();
  }
  return MakeLocalComm();
}

bool NcclBuilt() { return !PluginPath("nccl").empty(); }

std::unique_ptr<Comm> MakeNcclComm(Comm& bootstrap) {
  // The NCCL communicator is the plugin libkeel_nccl.so (core/plugin.h).
  auto make = PluginEntry<Comm* (*)(Comm*)>("nccl", "keel_nccl_comm", "NCCL");
  return std::unique_ptr<Comm>(make(&bootstrap));
}

}  // namespace keel::parallel
