// Which keel build a process runs, so that ranks (rank agreement), hosts (the supervisor's health
// check) and preflight can tell one build from another.
#pragma once

#include <cstdint>
#include <string>

namespace keel::resilience {

// xxh3 of this process's executable (/proc/self/exe).
uint64_t ExecutableHash();
// "keel 0123abcd...", with ", tag T" when $KEEL_BUILD_TAG is set (e.g. a container image digest).
std::string BuildIdentity();

}  // namespace keel::resilience
