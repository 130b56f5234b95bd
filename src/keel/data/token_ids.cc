// DecodeTokenIds and CheckTokenIds; see token_ids.h.
#include "keel/data/token_ids.h"

#include <cstring>

#include "keel/core/error.h"

namespace keel::data {

void DecodeTokenIds(const uint8_t* bytes, uint64_t n, size_t width, int32_t* out) {
  if (width == 4) {
    std::memcpy(out, bytes, n * 4);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, bytes + i * 2, 2);
    out[i] = int32_t(v);
  }
}

void CheckTokenIds(const uint8_t* bytes, uint64_t n, size_t width, int vocab,
                   const std::string& path) {
  for (uint64_t i = 0; i < n; ++i) {
    int32_t t;
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, bytes + i * 2, 2);
      t = int32_t(v);
    } else {
      std::memcpy(&t, bytes + i * 4, 4);
    }
    if (t < 0 || t >= vocab) {
      ThrowBadInput(path + ": token " + std::to_string(t) + " at offset " + std::to_string(i) +
                    " (byte " + std::to_string(i * width) + "): expected an id < " +
                    std::to_string(vocab));
    }
  }
}

}  // namespace keel::data
