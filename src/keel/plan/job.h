// What the planner is asked about: a model, a precision, a global batch, a cluster, and one
// parallel layout. Plain values shared by memory.h, comm_time.h and search.h.
#pragma once

#include <string>
#include <vector>

#include "keel/model/config.h"
#include "keel/parallel/grad_wire.h"
#include "keel/parallel/layout.h"
#include "keel/plan/hardware.h"

namespace keel::plan {

// A GPT shape. Named ones come from model::NamedConfig (gpt2-*) or the large-model table.
struct ModelSpec {
  std::string name = "custom";
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int vocab = 50257;
  int seq = 1024;
  model::Family family = model::Family::kGpt2;
  int kv_heads = 0;  // Llama: grouped-query key/value heads (0: heads)
  int ffn = 0;       // Llama: SwiGLU's hidden units (0: GPT-2's 4·hidden)
  // LoRA fine-tuning ([lora]): adapters of this rank on these products (model::LoraTarget bits),
  // the rest frozen: a compact state (adapters' master and moments), adapters' gradients reduced,
  // no weight-gradient products for the frozen matrices. 0: full training.
  int lora_rank = 0;
  unsigned lora_targets = 0;
  model::BaseQuant lora_base = model::BaseQuant::kNone;  // the frozen base's storage ([lora] base)
  float lora_dropout =
      0;  // [lora] dropout: two more activation buffers (the masked input, its grad)
  bool lora_dora = false;  // [lora] dora: magnitudes (one per output row) and the products' kept z
};

// A keel model config as the planner's spec, at sequence length `seq`.
ModelSpec SpecOf(const std::string& name, const model::ModelConfig& c, int seq);

// "gpt2-tiny".."gpt2-xl", "llama-tiny".."llama3-8b" (keel's own configs) and "7B" "13B" "22B"
// "175B" "530B" "1T" (GPT shapes: 7B/13B as in LLaMA-style tables, the rest from Korthikanti et al.
// 2022, Table 3). Throws bad input on an unknown name, listing the known ones.
ModelSpec NamedModel(const std::string& name);
std::vector<std::string> NamedModelNames();
model::ModelConfig ToModelConfig(const ModelSpec& m);
// Throws bad input (one line, with the numbers) on an inconsistent shape.
void ValidateModel(const ModelSpec& m);

enum class Precision { kFp32, kBf16 };  // bf16: bf16 weights/activations, fp32 master + moments
// kPaper: the usual 16 bytes/param (bf16 grads; ZeRO paper, DESIGN.md). kKeel: keel's trainer,
// which keeps fp32 grads (18 bytes/param, docs/ARCHITECTURE.md) and its exact activation arena.
enum class Accounting { kPaper, kKeel };
// Selective = Korthikanti's selective recomputation of the attention core (keel's "attn").
enum class Recompute { kNone, kSelective, kFull };

Precision ParsePrecision(const std::string& s);
Accounting ParseAccounting(const std::string& s);
Recompute ParseRecompute(const std::string& s);
const char* PrecisionName(Precision p);
const char* AccountingName(Accounting a);
const char* RecomputeName(Recompute r);

// The trainer's layout (parallel/layout.h: dp, tp, pp, zero, sp, virtual_stages, micro_batch) and
// what only the planner varies. The planner counts the micro-batches of a step from the job
// (Job::global_batch / (dp x micro_batch)) and plans equal stages: n_micro and stage_layers are
// left as they are.
struct Layout : parallel::Layout {
  Recompute recompute = Recompute::kNone;

  // Layout::Of({dp, tp, pp, zero}, micro_batch, recompute, sp, virtual_stages).
  static Layout Of(const parallel::ParallelDims& dims, int micro_batch,
                   Recompute recompute = Recompute::kNone, bool sp = false, int virtual_stages = 1);
  // Compares the layout and the planner's own field (the inherited == would see the layout only).
  bool operator==(const Layout&) const = default;
};

// Failures, storage and money: what the checkpoint interval and the cost of a whole run need.
struct RunInputs {
  // Llama 3 (Dubey et al. 2024, Section 3.3.4): 419 unexpected interruptions in 54 days on 2,048
  // nodes of 8 H100, i.e. about 6,300 hours between failures per node.
  double node_mtbf_hours = 6000;
  double storage_bytes_per_s = 0;  // aggregate checkpoint write bandwidth; 0: 2 GB/s per node
  double restart_s = 600;          // notice, requeue, start; reading the checkpoint comes on top
  double price_per_hour = 0;       // per accelerator-hour; 0: not given
  double tokens = 0;               // training tokens; 0: 20 per parameter (Hoffmann et al. 2022)
};

struct Job {
  ModelSpec model;
  Precision precision = Precision::kBf16;
  Accounting accounting = Accounting::kPaper;
  // Smaller optimizer state (train's optim.state_dtype, optim.master_weights): AdamW's moments in
  // bf16; no fp32 master (bf16 only).
  bool bf16_moments = false;
  bool master = true;
  // optim.grad_dtype = "bf16": the gradient buffer in bf16, fp32 buckets beside it (bf16 only).
  bool bf16_grads = false;
  // [parallel] grad_comm: the data-parallel gradient sums' wire format (its bytes per element;
  // int8 adds an fp32 residual per gradient element at dp > 1).
  parallel::GradWire grad_comm = parallel::GradWire::kF32;
  // [parallel] dp_sync = "diloco" with this many inner steps (0: synchronous): the replicas'
  // pseudo-gradients are summed once a round (dp's bytes / inner steps a step), and each rank
  // keeps DiLoCo's anchor and momentum (8 bytes per parameter). ZeRO 0, tp = pp = 1.
  int diloco_inner_steps = 0;
  // Streaming DiLoCo ([diloco] fragments > 1 or overlap_steps > 0): 8 more bytes per parameter
  // for the fragments' sends and averages (train/diloco.h).
  bool diloco_streaming = false;
  // [offload]: AdamW's moments, and a bf16 run's master, on a disk tier streamed through chunk
  // buffers of this many bytes (0: in memory); the tier's bandwidth per node, read and write
  // together (bytes/s; `keel preflight` measures it).
  double offload_chunk = 0;
  double offload_bytes_per_s = 2e9;
  // [offload] host: the tier is pinned host memory (a GPU's), its link each rank's PCIe at
  // offload_bytes_per_s.
  bool offload_host = false;
  // [offload] params: at ZeRO 3 the 16-bit weights' shard on the disk tier too, read before each
  // segment's all-gather (forward and backward, every micro-batch).
  bool offload_params = false;
  int global_batch = 512;  // sequences per optimizer step
  Cluster cluster;
  // Fraction of peak FLOP/s that the matrix products reach; the rest of the step time model
  // (bubble, exposed communication) comes on top.
  double efficiency = 0.6;
  RunInputs run;
};

// Throws bad input, one line with the numbers, if the layout cannot run this job: micro-batch >= 1,
// LoRA's ZeRO 0, 1 or 3 and an nf4 base's whole groups under tp,
// and the trainer's own checks (parallel::Layout::Validate: dims >= 1, zero stage,
// world = tp*pp*dp, heads, kv heads and the padded vocabulary % tp, layers % pp, global batch %
// (dp*micro_batch), sp, virtual stages, the pipeline's ZeRO and micro-batches). Search keeps to
// the layouts it passes.
void CheckLayout(const Job& job, const Layout& l);

}  // namespace keel::plan
