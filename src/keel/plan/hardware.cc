// The built-in accelerator table. Sources: NVIDIA data sheets (A100 80GB SXM, H100 SXM5,
// H200 SXM). Memory is the marketed size in GB (1e9 bytes); NVLink bandwidth is half the
// marketed bidirectional figure; inter-node is one HDR (200 Gb/s) NIC per A100 and one NDR
// (400 Gb/s) NIC per H100/H200, the usual DGX/HGX build.
#include "keel/plan/hardware.h"

#include "keel/core/error.h"

namespace keel::plan {

namespace {

const std::vector<Accelerator>& Table() {
  static const std::vector<Accelerator> t = {
      {"A100-80GB", 312e12, 80e9, 2.039e12, 300e9, 25e9},
      {"H100-80GB", 989e12, 80e9, 3.35e12, 450e9, 50e9},
      {"H200-141GB", 989e12, 141e9, 4.8e12, 450e9, 50e9},
  };
  return t;
}

}  // namespace

Accelerator NamedAccelerator(const std::string& name) {
  for (const auto& a : Table())
    if (a.name == name) return a;
  std::string known;
  for (const auto& n : AcceleratorNames()) known += (known.empty() ? "" : ", ") + n;
  ThrowBadInput("plan: unknown accelerator \"" + name + "\" (known: " + known + ")");
}

std::vector<std::string> AcceleratorNames() {
  std::vector<std::string> names;
  for (const auto& a : Table()) names.push_back(a.name);
  return names;
}

}  // namespace keel::plan
