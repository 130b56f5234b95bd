// Crash injection for the checkpoint crash tests: KEEL_CKPT_CRASH_AT=PHASE[:N] kills the process
// with SIGKILL the N-th time (default 1st) a save reaches PHASE, so a test can stop a run exactly
// between two steps of the commit protocol. Phases, in order: snapshot, write (data written, not
// fsynced), written (rank file and sidecar done), manifest, commit (COMMIT written), rename,
// latest, retention. Unset, it costs one getenv per process.
#pragma once

namespace keel::ckpt {

void MaybeCrash(const char* phase);

}  // namespace keel::ckpt
