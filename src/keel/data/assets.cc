#include "keel/data/assets.h"

#include <cstdlib>

namespace keel::data {

std::string AssetsDir() {
  if (const char* env = std::getenv("KEEL_ASSETS")) return env;
  return KEEL_ASSET_DIR;
}

std::string TokenizerDir() { return AssetsDir() + "/gpt2"; }

}  // namespace keel::data
