// Checks of values that users give keel before they reach a library that would take them as they
// are: listen addresses (civetweb turns "999.1.1.1" into 231.1.1.1 and binds it without a word),
// http(s) URLs, ranges, files that must be regular files (a FIFO would block a reader forever),
// folders that must be creatable, outputs that must not be one of the inputs, and buffers that
// input sizes, checked against the memory available before they are allocated.
// Each throws keel::Error (bad input) with one line that starts with `what` (the flag or the
// config key).
//
//   const std::string addr = keel::CheckListenAddress("[monitor] metrics_addr", cfg.addr);
//   keel::CheckRange("keel launch --np", np, 1, 4096);
//   keel::CheckNotAnInput("keel report --out", out, {run + "/metrics.jsonl"});
#pragma once

#include <string>
#include <vector>

namespace keel {

// An IPv4 address in dotted-quad form (each part 0-255), an IPv6 address (with or without
// brackets), or "localhost". Returns it as servers take it: IPv6 without brackets.
std::string CheckListenAddress(const std::string& what, const std::string& addr);

// Whether a checked listen address is loopback only (127.0.0.0/8, ::1, localhost): anything else
// is reachable from other machines and needs a token.
bool IsLoopbackAddress(const std::string& addr);

// An absolute http:// or https:// URL with a host (a name, an IPv4 address or [IPv6]) and, if
// any, a port in 1-65535.
void CheckHttpUrl(const std::string& what, const std::string& url);

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
double MemAvailableBytes();

// Sizes a buffer that input asks for before it is allocated, as keel train's memory check does for
// a run: more bytes than this machine has available is one line naming `what` and the sizes,
// instead of std::bad_alloc or the OOM killer. No check where MemAvailable cannot be read.
void CheckAllocation(const std::string& what, double bytes);

// `value` in [lo, hi]; NaN fails.
void CheckRange(const std::string& what, double value, double lo, double hi);

// The path names a regular file (or a link to one), checked without opening it for reading: a
// FIFO or a device would block or never end. Throws naming the path and what it found.
void CheckRegularFile(const std::string& path);

// The folder `path` exists, or can be created: its nearest existing ancestor is a folder this
// process may write. Creates nothing.
void CheckCanCreateFolder(const std::string& what, const std::string& path);

// `out` is none of `inputs` (after resolving links and "..", for paths that exist): writing it
// would destroy what is being read.
void CheckNotAnInput(const std::string& what, const std::string& out,
                     const std::vector<std::string>& inputs);

}  // namespace keel
