// Fuzzes safetensors files (ckpt::SafetensorsFile::Read: the length prefix, the JSON header, the
// byte ranges, F32/BF16/F16 conversion), and checks that what it accepts, SafetensorsWriter
// writes back and Read returns bit for bit.
//
// Input: the bytes of a .safetensors file.
#include <cstring>

#include "fuzz_util.h"
#include "keel/ckpt/safetensors.h"

namespace {

bool SameBits(const keel::ckpt::Fp32Tensor& a, const keel::ckpt::Fp32Tensor& b) {
  return a.shape == b.shape && a.data.size() == b.data.size() &&
         (a.data.empty() || std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch dir("safetensors");
  const std::string path = dir.Write("in.safetensors", keel::fuzz::Text(data, size));
  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const auto f = keel::ckpt::SafetensorsFile::Read(path);
    keel::ckpt::SafetensorsWriter w;
    for (const auto& [name, t] : f.tensors()) w.Add(name, t.shape, t.data.data());
    for (const auto& [k, v] : f.metadata()) w.SetMetadata(k, v);
    const std::string out = dir.path() + "/out.safetensors";
    keel::fuzz::ExpectSuccess("writing and reading back what Read returned", [&] {
      w.Write(out);
      const auto again = keel::ckpt::SafetensorsFile::Read(out);
      keel::fuzz::Check(again.metadata() == f.metadata(), "metadata changed in a round trip");
      keel::fuzz::Check(again.tensors().size() == f.tensors().size(), "tensors lost");
      for (const auto& [name, t] : f.tensors())
        keel::fuzz::Check(again.Has(name) && SameBits(again.Get(name), t),
                          "tensor " + name + " changed in a round trip");
    });
  });
  return 0;
}
