// Accelerators and clusters the planner knows: peak bf16 FLOP/s, memory, HBM bandwidth, and the
// per-accelerator bandwidth inside a node (NVLink) and between nodes (network). Every number can
// be overridden from the command line; the table only supplies defaults.
#pragma once

#include <string>
#include <vector>

namespace keel::plan {

struct Accelerator {
  std::string name;
  double bf16_flops = 0;  // dense, no sparsity
  double fp32_flops = 0;  // dense; TF32 tensor cores on the GPUs (half the bf16 rate)
  double memory_bytes = 0;
  double hbm_bytes_per_s = 0;
  double intra_bytes_per_s = 0;  // per accelerator, one direction (NVLink)
  double inter_bytes_per_s = 0;  // per accelerator, one direction (one NIC per accelerator)
  double host_bytes_per_s = 0;   // copy to host memory (PCIe), the checkpoint snapshot's rate
  // this-cpu only: the rate keel's own kernels reached on the job's shapes, in the planner's
  // hardware FLOPs per second of their measured time (`keel plan` measures it: cli/plan.cc), in
  // the precision `measured_fp32` says; 0 where nothing was measured. DefaultEfficiency takes it
  // over the peak. `measured_note` says what was timed, for the output.
  double measured_flops = 0;
  bool measured_fp32 = false;
  std::string measured_note{};
};

struct Cluster {
  Accelerator accel;
  int world = 8;     // accelerators in all
  int per_node = 8;  // accelerators per node
};

// "A100-80GB", "H100-80GB" (SXM), "H200-141GB". Throws bad input on an unknown name. "this-cpu"
// is measured, not tabled: see ThisCpu.
Accelerator NamedAccelerator(const std::string& name);
std::vector<std::string> AcceleratorNames();

// The peak FLOP/s of a precision: fp32 runs use fp32_flops (bf16/2 where it is not given).
double PeakFlops(const Accelerator& a, bool fp32);

// The fraction of peak a step's matrix products are assumed to reach when --efficiency is not
// given. 0.6 on the tabled GPUs (Megatron-LM-class MFU). On this-cpu, measured_flops / peak when
// the accelerator carries a measurement in this precision, so that the planner's compute time is
// the measured one. Without one (keel preflight's expectation), the MFU once measured on a 2-core
// AMX VM (docs/PERFORMANCE.md, GPT-2 124M B=4 T=256): 0.50 in fp32, 0.095 in bf16; on other
// CPUs these can be off several-fold, which is why `keel plan` measures.
double DefaultEfficiency(const Accelerator& a, bool fp32);

// This machine's CPUs as one accelerator, from measured figures (monitor/machine_probe.h and
// cli/plan.cc do the measuring; the planner only does arithmetic). bf16_flops and fp32_flops are
// the peaks of the FMA / bf16 / AMX loops (a CPU without bf16 instructions runs keel's bf16
// products in fp32: pass the fp32 peak for both); measured_flops is the rate of keel's kernels
// on the job's shapes (Accelerator::measured_flops), 0 if not measured. copy_bytes_per_s is
// memcpy's rate (bytes copied, each read once and written once), so memory bandwidth is twice it;
// ranks on one host exchange data through shared memory, two copies per message (half the copy
// rate); the checkpoint snapshot is one copy.
struct CpuFigures {
  double bf16_flops = 0, fp32_flops = 0, memory_bytes = 0, copy_bytes_per_s = 0;
  double measured_flops = 0;
  bool measured_fp32 = false;
};
Accelerator ThisCpu(const CpuFigures& f);

}  // namespace keel::plan
