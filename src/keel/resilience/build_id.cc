#include "keel/resilience/build_id.h"

#include <xxhash.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "keel/core/hex.h"
#include "keel/data/dataset_meta.h"

namespace keel::resilience {

uint64_t ExecutableHash() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  const std::string exe((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return XXH3_64bits(exe.data(), exe.size());
}

std::string BuildIdentity() {
  std::string id = "keel " + HashHex(ExecutableHash());
  if (const char* tag = std::getenv("KEEL_BUILD_TAG")) id += std::string(", tag ") + tag;
  return id;
}

}  // namespace keel::resilience
