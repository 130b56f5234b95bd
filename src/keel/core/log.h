// Logging: plain lines to stderr, prefixed by rank where there is more than one.
//
//   keel::Log("saved checkpoint %s", path.c_str());
#pragma once

namespace keel {

// Set once after the communicator is up; -1 means "don't prefix".
void SetLogRank(int rank);

[[gnu::format(printf, 1, 2)]] void Log(const char* fmt, ...);

}  // namespace keel
