// Hashes as text: 16 lowercase hex digits, the spelling meta.json, manifests and COMMIT files use.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

std::string HashHex(uint64_t hash);

}  // namespace keel
