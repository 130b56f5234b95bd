// Fuzzes the checkpoint manifest (ckpt::ManifestFromJsonText), and checks that what it accepts,
// ToJsonText writes back and ManifestFromJsonText reads to an equal manifest.
//
// Input: the text of manifest.json.
#include "fuzz_util.h"
#include "keel/ckpt/manifest.h"

namespace {

bool Equal(const keel::ckpt::Manifest& a, const keel::ckpt::Manifest& b) {
  return a.step == b.step && a.tokens == b.tokens && a.state == b.state && a.tensors == b.tensors;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const keel::ckpt::Manifest m =
        keel::ckpt::ManifestFromJsonText(keel::fuzz::Text(data, size), "manifest.json");
    const std::string written = keel::ckpt::ToJsonText(m);
    keel::fuzz::ExpectSuccess("reading back ToJsonText's output", [&] {
      const keel::ckpt::Manifest again = keel::ckpt::ManifestFromJsonText(written, "written");
      keel::fuzz::Check(Equal(again, m), "manifest round trip changed it:\n" + written);
    });
  });
  return 0;
}
