// This machine's name, as the lines that say where something happened print it ("rank 1 on
// node2", a lock's holder, a heartbeat).
#pragma once

#include <string>

namespace keel {

// gethostname(2); "unknown" if it fails.
std::string HostName();

}  // namespace keel
