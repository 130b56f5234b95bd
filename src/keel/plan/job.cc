// Named models, enum parsing and the one-line layout checks.
#include "keel/plan/job.h"

#include "keel/core/error.h"
#include "keel/model/quantize.h"

namespace keel::plan {

namespace {

// Korthikanti et al. 2022 (Table 3) for 22B..1T; 7B and 13B use the common GPT/LLaMA shapes.
// Vocabulary 51200 and s=2048 as in Megatron-LM's GPT runs.
const std::vector<ModelSpec>& LargeTable() {
  static const std::vector<ModelSpec> t = {
      {"7B", 32, 4096, 32, 51200, 2048},      {"13B", 40, 5120, 40, 51200, 2048},
      {"22B", 48, 6144, 64, 51200, 2048},     {"175B", 96, 12288, 96, 51200, 2048},
      {"530B", 105, 20480, 128, 51200, 2048}, {"1T", 128, 25600, 160, 51200, 2048},
  };
  return t;
}

}  // namespace

ModelSpec NamedModel(const std::string& name) {
  for (const auto& m : LargeTable())
    if (m.name == name) return m;
  for (const auto& n : model::NamedConfigNames()) {
    if (n != name) continue;
    const model::ModelConfig c = model::NamedConfig(n);
    return SpecOf(n, c, c.block_size);
  }
  std::string known;
  for (const auto& n : NamedModelNames()) known += (known.empty() ? "" : ", ") + n;
  ThrowBadInput("plan: unknown model \"" + name + "\" (known: " + known + ")");
}

std::vector<std::string> NamedModelNames() {
  std::vector<std::string> names = model::NamedConfigNames();
  for (const auto& m : LargeTable()) names.push_back(m.name);
  return names;
}

ModelSpec SpecOf(const std::string& name, const model::ModelConfig& c, int seq) {
  ModelSpec m{name, c.n_layer, c.n_embd, c.n_head, c.vocab_size, seq};
  m.family = c.family;
  if (c.llama()) m.kv_heads = c.kv_heads(), m.ffn = c.ffn();
  m.lora_rank = c.lora_rank;
  m.lora_targets = c.lora_targets;
  m.lora_base = c.lora_base;
  m.lora_dropout = c.lora_dropout;
  m.lora_dora = c.lora_dora;
  return m;
}

model::ModelConfig ToModelConfig(const ModelSpec& m) {
  model::ModelConfig c;
  c.n_layer = m.layers;
  c.n_embd = m.hidden;
  c.n_head = m.heads;
  c.vocab_size = m.vocab;
  c.block_size = m.seq;
  c.family = m.family;
  c.n_kv_head = m.kv_heads;
  c.ffn_hidden = m.ffn;
  c.lora_rank = m.lora_rank;
  c.lora_targets = m.lora_targets;
  c.lora_base = m.lora_base;
  c.lora_dropout = m.lora_dropout;
  c.lora_dora = m.lora_dora;
  c.lora_alpha = m.lora_rank > 0 ? 2.0f * float(m.lora_rank) : 0.0f;  // shapes only
  return c;
}

void ValidateModel(const ModelSpec& m) {
  if (m.layers < 1 || m.hidden < 1 || m.heads < 1 || m.vocab < 1 || m.seq < 1)
    ThrowBadInput("plan: layers, hidden, heads, vocab and seq must be >= 1 (got layers=" +
                  std::to_string(m.layers) + " hidden=" + std::to_string(m.hidden) +
                  " heads=" + std::to_string(m.heads) + " vocab=" + std::to_string(m.vocab) +
                  " seq=" + std::to_string(m.seq) + ")");
  if (m.hidden % m.heads != 0)
    ThrowBadInput("plan: hidden " + std::to_string(m.hidden) + " is not a multiple of heads " +
                  std::to_string(m.heads));
  if (m.kv_heads < 0 || (m.kv_heads > 0 && m.heads % m.kv_heads != 0))
    ThrowBadInput("plan: kv-heads " + std::to_string(m.kv_heads) + " does not divide heads " +
                  std::to_string(m.heads));
}

Precision ParsePrecision(const std::string& s) {
  if (s == "fp32") return Precision::kFp32;
  if (s == "bf16") return Precision::kBf16;
  ThrowBadInput("plan: precision: expected fp32 or bf16, got \"" + s + "\"");
}
Accounting ParseAccounting(const std::string& s) {
  if (s == "paper") return Accounting::kPaper;
  if (s == "keel") return Accounting::kKeel;
  ThrowBadInput("plan: accounting: expected paper or keel, got \"" + s + "\"");
}
Recompute ParseRecompute(const std::string& s) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective" || s == "attn") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  ThrowBadInput("plan: recompute: expected none, selective or full, got \"" + s + "\"");
}
const char* PrecisionName(Precision p) { return p == Precision::kFp32 ? "fp32" : "bf16"; }
const char* AccountingName(Accounting a) { return a == Accounting::kPaper ? "paper" : "keel"; }
const char* RecomputeName(Recompute r) {
  return r == Recompute::kNone ? "none" : r == Recompute::kSelective ? "selective" : "full";
}

Layout Layout::Of(const parallel::ParallelDims& dims, int micro_batch, Recompute recompute, bool sp,
                  int virtual_stages) {
  Layout l;
  static_cast<parallel::ParallelDims&>(l) = dims;
  l.micro_batch = micro_batch;
  l.recompute = recompute;
  l.sp = sp;
  l.virtual_stages = virtual_stages;
  return l;
}

void CheckLayout(const Job& job, const Layout& l) {
  if (l.micro_batch < 1)
    ThrowBadInput("plan: micro-batch " + std::to_string(l.micro_batch) + ": expected >= 1");
  // The trainer's refusals (train/run_setup.cc): ZeRO 2 would shard the adapters' gradients
  // alone, and an nf4 base whose shards' rows are not whole groups.
  if (job.model.lora_rank > 0 && l.zero == 2)
    ThrowBadInput(
        "plan: LoRA runs with ZeRO 0, 1 or 3 (got zero 2: its gradients are the "
        "adapters' alone)");
  if (job.diloco_inner_steps > 0 && (l.zero > 0 || l.tp > 1 || l.pp > 1 || l.cp > 1))
    ThrowBadInput("plan: DiLoCo runs with ZeRO 0 and tp = pp = cp = 1 (got zero " +
                  std::to_string(l.zero) + ", tp " + std::to_string(l.tp) + ", pp " +
                  std::to_string(l.pp) + ", cp " + std::to_string(l.cp) + ")");
  const model::ModelConfig cfg = ToModelConfig(job.model);
  if (const std::string why = model::TpQuantProblem(cfg, l.tp); !why.empty())
    ThrowBadInput("plan: --lora-base nf4: " + why);

  // The checks the trainer makes too, in one place, over the micro-batches the planner counts and
  // the vocabulary the trainer pads (to a multiple of 128: tp must divide it).
  parallel::Layout t = l;
  if (l.dp >= 1) t.n_micro = job.global_batch / (l.dp * l.micro_batch);
  t.Validate({.world = job.cluster.world,
              .n_head = job.model.heads,
              .n_layer = job.model.layers,
              .n_kv_head = job.model.kv_heads,
              .ffn_hidden = job.model.ffn,
              .padded_vocab = cfg.padded_vocab(),
              .global_batch = job.global_batch,
              .seq_len = job.model.seq},
             "plan: ");
}

}  // namespace keel::plan
