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
  double memory_bytes = 0;
  double hbm_bytes_per_s = 0;
  double intra_bytes_per_s = 0;  // per accelerator, one direction (NVLink)
  double inter_bytes_per_s = 0;  // per accelerator, one direction (one NIC per accelerator)
};

struct Cluster {
  Accelerator accel;
  int world = 8;     // accelerators in all
  int per_node = 8;  // accelerators per node
};

// "A100-80GB", "H100-80GB" (SXM), "H200-141GB". Throws bad input on an unknown name.
Accelerator NamedAccelerator(const std::string& name);
std::vector<std::string> AcceleratorNames();

}  // namespace keel::plan
