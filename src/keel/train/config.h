// The run configuration: one TOML file with the sections of DESIGN.md, each mapped to a typed
// struct with a documented default for every field (docs/CONFIG.md lists them all).
//
// Unknown keys and wrong types are errors naming the file and key; `--set section.key=value`
// overrides any key after the file is read.
//
//   keel::train::RunConfig cfg =
//       keel::train::LoadConfig("configs/quickstart.toml", {"optim.lr=1e-3"});
//   std::string resolved = keel::train::ToToml(cfg);  // written to runs/NAME/config.toml
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/model/config.h"
#include "keel/parallel/layout.h"

namespace keel::train {

struct ModelSection {
  std::string name = "gpt2-mini";  // a named config; the keys below override its shapes when > 0
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;
  int block_size = 0;
  int n_kv_head = 0;               // Llama: key/value heads (grouped-query attention)
  int ffn_hidden = 0;              // Llama: SwiGLU's hidden units
  float rope_theta = 0;            // Llama: the rotary base
  std::string recompute = "none";  // "none" | "attn" | "full"
  float init_std = 0.02f;
  // A keel model file or a Hugging Face GPT-2 safetensors file whose weights replace the random
  // initialization (fine-tuning); its shapes must be the ones above. "" = random init.
  std::string init_from;
  // A PEFT LoRA adapter folder merged into init_from's weights ("" = none).
  std::string init_adapter;

  bool operator==(const ModelSection&) const = default;
};

// One entry of [[data.sources]]: a training dataset and its share of the blend.
struct DataSource {
  std::string path;     // like [data] train
  double weight = 1.0;  // relative; the shares are weight / sum of weights

  bool operator==(const DataSource&) const = default;
};

struct DataSection {
  std::string train;  // a keel-tokens dataset folder, or a flat file of little-endian uint16 tokens
  std::string val;    // same; empty = no validation
  int seq_len = 256;  // tokens per sample (T)
  int prefetch = 3;   // micro-batches a background thread prepares ahead of the trainer
  // The alternative to `train`: several datasets blended by weight ([[data.sources]] in TOML).
  // Exactly one of the two is set in a run.
  std::vector<DataSource> sources;

  bool operator==(const DataSection&) const = default;
};

struct TrainSection {
  std::string name = "run";  // run directory: out_dir/name
  std::string out_dir = "runs";
  int steps = 100;
  int batch_size = 8;        // global batch, in sequences, over all ranks and micro-batches
  int micro_batch_size = 0;  // sequences per rank per forward/backward; 0 = batch_size / ranks
  // "bf16" | "fp32" | "fp16" (with loss scaling) | "fp8" (bf16 with fp8 block products:
  // model/fp8_products.h; emulated where the backend has no fp8 products, as on the CPU)
  std::string precision = "bf16";
  std::string fp8_recipe = "current";  // "current" | "delayed" (core/fp8.h, Fp8Recipe)
  int fp8_amax_history = 16;           // steps of amax kept: delayed scales, spike tests
  float fp8_spike = 64;                // a block's amax above this × the history's: bf16 (0: off)
  std::string device = "cpu";          // "cpu" | "cuda": the backend the state and kernels live on
  uint64_t seed = 1337;
  int val_every = 50;   // steps between validation passes; 0 = only at the end
  int val_batches = 8;  // validation windows: the split's first val_batches × batch_size (0: all)
  int log_every = 1;    // steps between progress lines
  std::string sample_prompt = "The";  // prompt for the samples printed at the end ("" = none)
  int sample_tokens = 48;
  int sample_count = 3;
  // End this invocation after step N, as at the end (checkpoint, model file), while the schedule
  // still spans `steps`: a job in time slices continues with --resume auto. 0 = off.
  int stop_at = 0;

  bool operator==(const TrainSection&) const = default;
};

struct OptimSection {
  float lr = 6e-4f;
  float min_lr = 6e-5f;  // the floor the decay ends at
  int warmup_steps = 10;
  std::string schedule = "cosine";  // "cosine" | "linear" | "constant"
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // on matrices and embeddings only (not biases or LayerNorm)
  float grad_clip = 1.0f;     // global L2 norm; 0 = off
  // Parameters not trained (fine-tuning): comma-separated name patterns, e.g. "wte.*,wpe.*".
  std::string freeze;
  // AdamW's moments: "fp32" or "bf16" (stochastically rounded; 18 -> 14 bytes per parameter of
  // a bf16 run).
  std::string state_dtype = "fp32";
  // false (bf16 runs, not LoRA): no fp32 master copy; the bf16 weights take each update with
  // stochastic rounding (llm.c's master-less mode; 4 bytes per parameter fewer).
  bool master_weights = true;
  // The gradient buffer: "fp32" or "bf16" (bf16 and fp16 runs on the CPU, not LoRA): backward
  // computes each segment into an fp32 bucket that is added into it rounded, and a
  // data-parallel sum travels in fp32 (4 bytes per parameter -> 2, so 14 -> 12 with bf16
  // moments: Megatron's precision-aware optimizer's main_grads_dtype).
  std::string grad_dtype = "fp32";

  bool operator==(const OptimSection&) const = default;
};

// Dynamic loss scaling (optim/loss_scaler.h; Megatron-LM's and DeepSpeed's semantics): the loss
// gradient is scaled up so that small gradients survive a 16-bit format, overflowing steps are
// skipped and the scale backs off; never an abort.
struct LossScaleSection {
  // "auto" (dynamic for train.precision = "fp16", else none) | "none" | "dynamic"
  std::string kind = "auto";
  double initial = 65536;
  double min = 1;
  int growth_interval = 1000;  // clean steps in a row before the scale doubles
  int hysteresis = 2;          // overflows tolerated before a backoff
  double growth = 2;
  double backoff = 0.5;
  // fp16: this many overflowing steps in a row at the minimum scale switch the run to bf16 (a
  // checkpoint, an event, and the run resumes from it in bf16; later restarts stay in bf16).
  // 0: never (the steps are skipped and the run goes on in fp16).
  int switch_after = 16;

  bool operator==(const LossScaleSection&) const = default;
};

// An offload tier (optim/offload_tier.h): AdamW's moments, and a bf16 run's fp32 master, in a
// scratch file in `dir` instead of memory (12 of a bf16 run's 18 bytes per parameter), streamed
// through three buffers of `chunk_mib` during the update. Empty `dir`: all in memory. `host`
// (train.device = "cuda", bf16): the same state in pinned host memory instead of the GPU's, updated
// by the CPU chunk by chunk as each chunk's gradients arrive.
struct OffloadSection {
  std::string dir;
  double chunk_mib = 16;
  bool host = false;
  bool params = false;  // ZeRO 3: the bf16/fp16 weights' shard on the tier too

  bool operator==(const OffloadSection&) const = default;
};

// LoRA adapters (model/config.h): only they are trained; the model's own weights stay frozen.
struct LoraSection {
  int rank = 0;     // 0: off
  float alpha = 0;  // the update's scale is alpha / rank; 0: 2 × rank
  // Comma-separated products of each block: GPT-2 c_attn, attn.c_proj, c_fc, mlp.c_proj; Llama
  // qkv, o_proj, gate_up, down_proj; or "all". "": c_attn (GPT-2), qkv (Llama), PEFT's defaults.
  std::string targets;
  // The frozen base's block matrices: "" (the run's precision), "int8" (per-row scales) or "nf4"
  // (4-bit NormalFloat, blocks of 64): QLoRA's memory, dequantized before each product.
  std::string base;
  // PEFT's lora_dropout: the probability that an element of an adapted product's input is zeroed
  // before A (training only; the mask a function of the seed, step, layer, product and the
  // element's place in the global batch, so every layout draws it alike). 0: off.
  float dropout = 0;
  // DoRA (PEFT's use_dora): a trained magnitude per output row of each adapted product, over the
  // direction of W + s·B·A (under dropout in PEFT's form: docs/ARCHITECTURE.md).
  bool dora = false;

  bool operator==(const LoraSection&) const = default;
};

struct ParallelSection {
  // The layout (parallel/layout.h): data-parallel replicas, tensor-parallel shards, pipeline
  // stages, ZeRO stage over the data-parallel group. Checked at start by ResolveLayout.
  int dp = 0;  // 0 = the ranks launched / (tp x pp x cp)
  int tp = 1;
  int pp = 1;
  bool sp = false;                // sequence parallelism over the tp group (tp > 1)
  int virtual_stages = 1;         // model chunks per pipeline rank: > 1 is interleaved 1F1B
  std::string pp_layers;          // blocks per stage: "" equal, "auto" balanced, or "9,3"
  int zero = 0;                   // 0: replicated; 1: optimizer state; 2: + gradients; 3: + weights
  float bucket_mb = 25.0f;        // gradient all-reduce bucket size
  float comm_timeout_s = 600.0f;  // a collective that takes longer is a hang: exit 75
  // The data-parallel gradient sums' wire format (parallel/grad_wire.h): "fp32", "bf16", "int8".
  std::string grad_comm = "fp32";
  // How data-parallel replicas stay together: "step" (their gradients are summed every step) or
  // "diloco" (each takes [diloco] inner_steps steps alone, then they average the change).
  std::string dp_sync = "step";
  int cp = 1;  // context parallelism: each sequence over cp ranks (parallel/zigzag.h)
  std::string cp_comm = "ring";  // how keys and values travel: "ring" or "allgather"

  bool operator==(const ParallelSection&) const = default;
};

// DiLoCo (Douillard et al. 2023), [parallel] dp_sync = "diloco": every inner_steps steps the
// replicas' pseudo-gradients (the weights at the round's start less their own now) are averaged
// (in [parallel] grad_comm's format) and applied by SGD with Nesterov momentum.
struct DilocoSection {
  int inner_steps = 50;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  // Streaming DiLoCo (train/diloco.h): the weights in `fragments` staggered slices, each slice's
  // average landing `overlap_steps` inner steps after it was sent.
  int fragments = 1;
  int overlap_steps = 0;

  bool operator==(const DilocoSection&) const = default;
};

// The streaming schedule's one rule, for `keel train`'s [diloco] and `keel plan`'s flags: the key
// that breaks it ("fragments" or "overlap_steps") and what was expected, or {"", ""}. Needs
// inner_steps > 0.
std::pair<std::string, std::string> DilocoScheduleProblem(int inner_steps, int fragments,
                                                          int overlap_steps);

struct CheckpointSection {
  bool save_final = true;        // write model.safetensors at the end (and on Ctrl-C)
  std::string dir;               // checkpoint root; "" = out_dir/name/checkpoints
  int every_steps = 0;           // save every N steps; 0 = off
  double every_minutes = 30;     // save when this many minutes passed since the last save; 0 = off
  bool at_end = true;            // save after the last step
  bool on_signal = true;         // SIGTERM/SIGINT: finish the step, save, exit 0
  int keep_last = 3;             // committed checkpoints kept (the newest)
  int keep_every = 0;            // also keep every step that is a multiple of this; 0 = none
  std::string if_busy = "wait";  // a trigger while a save is in flight: "wait" | "skip"
  std::string resume;            // "" = fresh run | "auto" | a checkpoint folder
  int writer_nice = 0;           // the writer thread's nice (0..19): its CPU time vs the step's
  bool direct_io = true;         // write with O_DIRECT where the file system takes it
  int peer_every = 0;            // tier 0: a copy in holders' memory every N steps (keel launch)
  double peer_rate_mbit = 0;     // its send's pace per rank; 0 = as fast as the link goes

  bool operator==(const CheckpointSection&) const = default;
};

// The detectors of docs/RESILIENCE.md; each writes what it saw to events.jsonl.
struct ResilienceSection {
  bool stop_on_nonfinite = false;  // a NaN/Inf loss or gradient stops the run (false: skip it)
  int max_skips = 3;               // non-finite steps in a row skipped before a rollback
  int spike_window = 50;           // steps of loss and gradient norm the spike detectors keep
  int spike_min_steps = 20;        // no spike verdict before this many
  double spike_z = 6.0;            // deviations above the window's mean ...
  double spike_ratio = 1.5;        // ... and times its median: a loss spike
  double norm_spike_ratio = 0;     // the same for the gradient norm (0: not watched)
  bool rollback = true;            // on a spike: back to the checkpoint before it, skip its data
  int max_rollbacks = 3;           // rollbacks within rollback_window steps before giving up
  int rollback_window = 1000;
  std::string skip_batches;  // "STEP:COUNT,...": at step STEP, skip COUNT global batches
  int sdc_every = 100;       // steps between replica hash comparisons (0: off)
  int straggler_every = 20;  // steps between compute-time comparisons (0: off)
  double straggler_ratio = 1.3;
  int straggler_checks = 3;      // checks in a row slower than the ratio before a rank is named
  bool straggler_fails = false;  // a named straggler exits 75 so keel launch excludes its host
  double hang_timeout_s = 1800;  // a step running this long: name who is stuck, exit 75 (0: off)

  bool operator==(const ResilienceSection&) const = default;
};

// keel launch, the supervisor (docs/CONFIG.md, [launch]); keel train reads only heartbeat_s.
struct LaunchSection {
  std::string launcher = "auto";  // auto | local | mpirun | slurm
  std::string hostfile;           // OpenMPI hostfile ("name slots=N" lines); "" = none
  int ranks_per_host = 0;         // 0: the hostfile's slots, Slurm's tasks per node, or 1
  std::string spares;             // hosts held back to replace failed ones: "h7,h8"
  std::string launcher_args;      // extra arguments for mpirun or srun, split at spaces
  int max_restarts = 10;
  double backoff_s = 10;       // wait before a restart, doubled after each consecutive failure
  double backoff_max_s = 300;  // ... up to this
  int window_failures = 5;     // this many failures within window_minutes: give up (0 = off)
  double window_minutes = 30;
  int host_failures = 2;             // failures of a host's ranks before it is excluded
  double heartbeat_s = 5;            // each rank beats this often under keel launch
  double heartbeat_timeout_s = 120;  // a rank silent this long is stopped (0 = off)
  double health_timeout_s = 60;      // a host's health check that takes longer fails
  double health_min_free_gb = 1;     // free disk in the checkpoint folder, per host
  double health_min_gflops = 0;      // 0: the matrix product's rate is reported, not judged
  double stop_grace_s = 300;         // after asking the job to save and stop, kill it after this
  double regrow_minutes = 10;   // re-check excluded hosts this often while shrunk (0 = at restarts)
  int holder_port = 29790;      // tier-0 holders listen here on each host ([checkpoint] peer_every)
  double holder_memory_gb = 0;  // what a holder keeps at most; 0 = no limit
  std::string holder_spill_dir;  // holders also keep their copies here on each host's disk

  bool operator==(const LaunchSection&) const = default;
};

// [monitor.alerts]: see monitor/alerts.h and docs/CONFIG.md.
struct AlertsSection {
  bool nonfinite = true;
  double loss_ceiling = 0;     // after [optim] warmup_steps; 0 = off
  double throughput_drop = 0;  // fraction below the running median; 0 = off
  double no_step_s = 0;
  double checkpoint_age_min = 0;
  double min_free_disk_gb = 0;
  bool straggler = true;
  std::string webhook;

  bool operator==(const AlertsSection&) const = default;
};

struct MonitorSection {
  double peak_gflops = 0;  // per rank, for MFU; 0 = measured on this CPU (cached)
  bool metrics_jsonl = true;
  int metrics_port = 0;  // Prometheus endpoint on rank 0; 0 = none
  std::string metrics_addr = "127.0.0.1";
  std::string metrics_token;  // required for a non-loopback metrics_addr
  AlertsSection alerts;

  bool operator==(const MonitorSection&) const = default;
};

struct RunConfig {
  std::string source;  // the file it was read from, for messages
  ModelSection model;
  DataSection data;
  TrainSection train;
  OptimSection optim;
  LossScaleSection loss_scale;
  OffloadSection offload;
  LoraSection lora;
  ParallelSection parallel;
  DilocoSection diloco;
  CheckpointSection checkpoint;
  ResilienceSection resilience;
  MonitorSection monitor;
  LaunchSection launch;

  // The model shapes: the named config with any explicit overrides applied, validated.
  model::ModelConfig ResolvedModel() const;

  // Compares every value, `source` included (a round-trip test resets it first).
  bool operator==(const RunConfig&) const = default;
};

// Reads `path` (may be empty: defaults only), applies `overrides` ("section.key=value", value in
// TOML syntax or a bare string), validates every value. Throws keel::Error (bad input) with one
// line naming the file and key.
RunConfig LoadConfig(const std::string& path, const std::vector<std::string>& overrides);

// The fully resolved config as TOML text (every key, with its value); LoadConfig reads it back
// to an equal config.
std::string ToToml(const RunConfig& cfg);

// The run's layout over `world` ranks (parallel/layout.h), read from [parallel] and [train]: dp = 0
// resolved to world / (tp x pp), micro_batch (train.micro_batch_size, 0: batch_size / dp) and
// n_micro (batch_size / dp / micro_batch) counted, stage_layers from pp_layers (empty for equal
// stages, "auto" FLOP-balanced by model::BalancedStageLayers, or the list given, "9,3"). Checked
// by the layout's rules (parallel::Layout::Validate: the ranks, the model's heads, layers and
// padded vocabulary, the global batch over dp x micro-batches, sp, virtual_stages, the pipeline's
// ZeRO and micro-batches), in the config's words. Throws keel::Error (bad input) with one line,
// e.g. "config a.toml: [parallel] tp=4 x pp=1 x dp=1 = 4 does not match the 6 ranks launched",
// "config a.toml: [train] batch_size: 10 is not divisible by ranks (2) × micro_batch_size (4)".
parallel::Layout ResolveLayout(const RunConfig& cfg, int world);

// [resilience] skip_batches: step -> global batches skipped at that step; nullopt if malformed.
std::optional<std::map<int, int>> ParseSkipBatches(const std::string& text);

}  // namespace keel::train
