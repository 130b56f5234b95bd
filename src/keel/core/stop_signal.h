// SIGINT/SIGTERM as a request to stop, handled on one thread of keel's own. SIGUSR2 is the same
// request from a supervisor: mpirun forwards SIGUSR2 to every rank without killing them after a
// second, as it does on SIGTERM (keel launch uses it to stop a job that should checkpoint).
//
// A signal handler runs on whichever thread the kernel picks (an OpenMP worker inside a kernel,
// the data prefetcher, MPI's progress thread) and makes some of their system calls fail with
// EINTR. Instead, main() blocks both signals before any thread exists, so every thread inherits
// the mask, and one thread takes them with sigwait(). While a StopScope is alive (the training
// loop) a signal only sets its flag; outside one, the signal does what it does by default
// (ends the process), so Ctrl-C still stops `keel data prepare` at once; so does a second
// signal inside a scope.
//
//   int main() { keel::InstallStopSignals(); ... }
//   keel::StopScope stop;                       // in the training loop
//   if (stop.requested()) ...                   // after each step
#pragma once

namespace keel {

// Call first in main(), before any thread is started. Idempotent.
void InstallStopSignals();

class StopScope {
 public:
  StopScope();  // without InstallStopSignals (e.g. in a test), falls back to a plain handler
  ~StopScope();
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;

  bool requested() const;
};

}  // namespace keel
