// The built-in accelerator table. Sources: NVIDIA data sheets (A100 80GB SXM, H100 SXM5,
// H200 SXM). Memory is the marketed size in GB (1e9 bytes); NVLink bandwidth is half the
// marketed bidirectional figure; inter-node is one HDR (200 Gb/s) NIC per A100 and one NDR
// (400 Gb/s) NIC per H100/H200, the usual DGX/HGX build. fp32 is the dense TF32 tensor-core rate
// (half of bf16). Host copies: PCIe 4.0 x16 (A100) and 5.0 x16 (H100/H200) at about 80% of the
// line rate.
#include "keel/plan/hardware.h"

#include "keel/core/error.h"

namespace keel::plan {

namespace {

const std::vector<Accelerator>& Table() {
  static const std::vector<Accelerator> t = {
      {"A100-80GB", 312e12, 156e12, 80e9, 2.039e12, 300e9, 25e9, 25e9},
      {"H100-80GB", 989e12, 495e12, 80e9, 3.35e12, 450e9, 50e9, 50e9},
      {"H200-141GB", 989e12, 495e12, 141e9, 4.8e12, 450e9, 50e9, 50e9},
  };
  return t;
}

}  // namespace

Accelerator NamedAccelerator(const std::string& name) {
  for (const auto& a : Table())
    if (a.name == name) return a;
  if (name == "this-cpu")
    ThrowBadInput("plan: this-cpu is measured, not tabled (plan::ThisCpu from the machine probe)");
  std::string known;
  for (const auto& n : AcceleratorNames()) known += (known.empty() ? "" : ", ") + n;
  ThrowBadInput("plan: unknown accelerator \"" + name + "\" (known: " + known + ")");
}

std::vector<std::string> AcceleratorNames() {
  std::vector<std::string> names;
  for (const auto& a : Table()) names.push_back(a.name);
  names.push_back("this-cpu");
  return names;
}

double PeakFlops(const Accelerator& a, bool fp32) {
  if (!fp32) return a.bf16_flops;
  return a.fp32_flops > 0 ? a.fp32_flops : a.bf16_flops / 2;
}

double DefaultEfficiency(const Accelerator& a, bool fp32) {
  if (a.name != "this-cpu") return 0.6;
  const double peak = PeakFlops(a, fp32);
  if (a.measured_flops > 0 && a.measured_fp32 == fp32 && peak > 0) return a.measured_flops / peak;
  return fp32 ? 0.50 : 0.095;
}

Accelerator ThisCpu(const CpuFigures& f) {
  Accelerator a;
  a.name = "this-cpu";
  a.bf16_flops = f.bf16_flops;
  a.fp32_flops = f.fp32_flops;
  a.memory_bytes = f.memory_bytes;
  a.hbm_bytes_per_s = 2 * f.copy_bytes_per_s;  // a copy reads and writes every byte
  a.intra_bytes_per_s = f.copy_bytes_per_s / 2;
  // Between hosts: one 10 Gb/s Ethernet port, the common server default; --inter-gbps overrides.
  a.inter_bytes_per_s = 1.25e9;
  a.host_bytes_per_s = f.copy_bytes_per_s;  // the snapshot is a copy within memory
  a.measured_flops = f.measured_flops;
  a.measured_fp32 = f.measured_fp32;
  // No peak loop for this CPU: the measured rate stands in for the peak (efficiency 1).
  if (f.measured_flops > 0 && PeakFlops(a, f.measured_fp32) <= 0)
    (f.measured_fp32 ? a.fp32_flops : a.bf16_flops) = f.measured_flops;
  return a;
}

}  // namespace keel::plan
