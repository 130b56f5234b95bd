// Each profiled kernel of a training step against its own roofline: the time it would take at
// this machine's memory bandwidth (bytes it must move, at the traffic of a large memcpy:
// monitor::MeasureCopyRate, each byte read and written) or at its peak (FLOPs it must do),
// whichever is longer. A kernel at 100% is at its limit; one at 20% has 5x to gain.
//
// The byte and FLOP counts are the minimum each kernel's contract needs on the step's shapes
// (single process, no recompute): every tensor read or written once, in its storage dtype.
// They are models, not counters; the comments give each one.
#pragma once

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "keel/core/dtype.h"
#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::bench {

struct KernelCost {
  double bytes = 0, flops = 0;
  bool gemm = false;  // its FLOPs run at the matrix peak (dtype's), not the fp32 vector one
};

// Per step, for the kernels a GPT-2 or Llama step profiles (kernels/profile.h's names).
inline std::map<std::string, KernelCost> StepCosts(const model::ModelConfig& m, int B, int T,
                                                   DType dt, double params) {
  const double s = dt == DType::kBF16 ? 2 : 4;  // activation bytes
  const double BT = double(B) * T, C = m.n_embd, L = m.n_layer, V = m.padded_vocab();
  const double F = m.ffn();
  const double per_layer = (double(model::MatmulParams(m)) - V * C) / L;  // the blocks' matrices
  // Σ (inputs + outputs) of a block's products per row: qkv, proj, fc, fc2 (or gate_up, down).
  const double io = m.llama() ? 8 * C + 3 * F : 4 * C + 2 * C + C + F + F + C;
  std::map<std::string, KernelCost> k;
  // Products: 2 FLOPs per multiply-add, weights and activations read once; backward twice
  // forward (dx and dW).
  const double fwd_bytes = L * (per_layer + BT * io) * s;
  k["matmul_fwd"] = {fwd_bytes, 2 * BT * per_layer * L, true};
  k["matmul_bwd"] = {2 * fwd_bytes, 4 * BT * per_layer * L, true};
  // Classifier: 3 products over the padded vocabulary; its fp32 logits are written once and read
  // for the log-sum-exp and the gradient, the gradient written and read by both products.
  k["classifier"] = {BT * V * (4 + 4 + 4 + s + 2 * s), 6 * BT * V * C, true};
  // Causal flash attention: QKᵀ and PV over half the T×T scores, in fp32 (about 2·B·T²·C
  // FLOPs per layer forward, 2.5× that backward); q, k, v and the output read/written once.
  k["attention_fwd"] = {L * BT * C * 4 * s, L * 2.0 * B * T * T * C, false};
  k["attention_bwd"] = {L * BT * C * 8 * s, L * 5.0 * B * T * T * C, false};
  // Norms: 2L+1 of them; forward reads x and writes y, backward reads x and dy and adds into
  // dx (read + write).
  const double norms = 2 * L + 1;
  k[m.llama() ? "rmsnorm" : "layernorm"] = {norms * BT * C * 6 * s, norms * BT * C * 20, false};
  if (m.llama()) {
    // SwiGLU: forward reads gate and up, writes h; backward reads both and dh, writes two.
    k["swiglu"] = {L * BT * F * 8 * s, L * BT * F * 30, false};
    // RoPE: the query and key heads of each row read and written in place, forward and
    // backward (the value heads are not touched).
    const double rotated = C + double(m.kv_heads()) * m.head_size();
    k["rope"] = {L * BT * rotated * 4 * s, L * BT * rotated * 6, false};
  } else {
    // GELU (tanh form): forward reads and writes 4C per row; backward reads x and dy, writes dx.
    k["gelu"] = {L * BT * F * 5 * s, L * BT * F * 50, false};
  }
  // AdamW on fp32 master, m, v and gradient (read), master, m, v (written), the bf16 copy.
  k["adamw"] = {params * (28 + (dt == DType::kBF16 ? 2 : 0)), params * 15, false};
  return k;
}

// {"kernel": {"ms", "floor_ms", "of_roofline", "bound"}} for the kernels of `breakdown_ms`.
inline nlohmann::json Roofline(const std::map<std::string, double>& breakdown_ms,
                               const std::map<std::string, KernelCost>& costs, double bandwidth,
                               double vector_peak, double matrix_peak) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, ms] : breakdown_ms) {
    auto it = costs.find(name);
    if (it == costs.end() || ms <= 0) continue;
    const KernelCost& c = it->second;
    const double mem_ms = 1e3 * c.bytes / bandwidth;
    const double flop_ms = 1e3 * c.flops / (c.gemm ? matrix_peak : vector_peak);
    const double floor_ms = std::max(mem_ms, flop_ms);
    out[name] = {{"ms", ms},
                 {"floor_ms", floor_ms},
                 {"of_roofline", floor_ms / ms},
                 {"bound", mem_ms > flop_ms ? "memory" : "compute"}};
  }
  return out;
}

}  // namespace keel::bench
