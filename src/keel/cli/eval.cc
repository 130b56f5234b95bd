// keel eval: the loss and perplexity of a run, a checkpoint or a model file on a dataset, over the
// whole split (or its first --max-tokens) in fixed windows: train/evaluation.h.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "keel/ckpt/model_source.h"
#include "keel/ckpt/peft.h"
#include "keel/cli/model_tokenizer.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/validate.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/model/activations.h"
#include "keel/model/params.h"
#include "keel/model/transformer.h"
#include "keel/parallel/comm.h"
#include "keel/train/config.h"
#include "keel/train/evaluation.h"
#include "keel/train/rank_agreement.h"

namespace keel::cli {
namespace {

struct Args {
  std::string source, data, precision, adapter;
  int seq_len = 0, batch = 0;
  long long max_tokens = 0;
  bool json = false;
};

// What a rank reads and checks before the evaluation's first collective.
struct Prepared {
  ckpt::LoadedModel m;
  std::string data, precision;
  int T = 0, B = 0;
  DType dtype = DType::kF32;
  std::unique_ptr<data::TokenDataset> ds;
  train::EvalPlan plan;
  std::unique_ptr<model::Transformer> model;
};

std::unique_ptr<Prepared> Prepare(const Args& a) {
  auto p = std::make_unique<Prepared>();
  const std::optional<train::RunConfig> run = RunConfigOf(a.source);
  p->m = ckpt::LoadAnyModel(a.source);
  ckpt::LoadedModel& m = p->m;
  if (!a.adapter.empty()) ckpt::MergePeftAdapter(a.adapter, m.config, &m.weights);
  const model::ModelConfig& cfg = m.config;
  // What the flags leave open comes from the run (its validation split, sequence length, micro-
  // batch and precision), else from the model.
  std::string& data = p->data;
  data = a.data;
  if (data.empty() && run) data = run->data.val;
  if (data.empty())
    ThrowBadInput("eval: give --data PATH (" + a.source +
                  (run ? "'s run has no [data] val)" : " is not part of a run)"));
  const int T = p->T = a.seq_len > 0 ? a.seq_len : run ? run->data.seq_len : cfg.block_size;
  if (T > cfg.block_size)
    ThrowBadInput("eval: --seq-len " + std::to_string(T) + " is longer than the model's context (" +
                  std::to_string(cfg.block_size) + ")");
  int B = a.batch;
  if (B <= 0 && run)
    B = run->train.micro_batch_size > 0 ? run->train.micro_batch_size : run->train.batch_size;
  if (B <= 0) B = 4;
  std::string& precision = p->precision;
  precision = a.precision.empty() ? (run ? run->train.precision : "fp32") : a.precision;
  if (precision != "fp32" && precision != "bf16")
    ThrowBadInput("eval: --precision: expected fp32 or bf16, got \"" + precision + "\"");
  if (a.seq_len < 0 || a.batch < 0 || a.max_tokens < 0)
    ThrowBadInput("eval: --seq-len, --batch and --max-tokens must be >= 0");

  p->ds = std::make_unique<data::TokenDataset>(data::TokenDataset::Open(data));
  const data::TokenDataset& ds = *p->ds;
  ds.CheckIds(cfg.vocab_size);
  // Ids of another tokenizer that happen to fit the model's vocabulary would score as a loss.
  const std::optional<KnownTokenizer> known = TokenizerOfModel(a.source, run);
  if (known && ds.vocab_size() != known->vocab_size)
    ThrowBadInput("eval: " + data + " holds ids of the tokenizer " +
                  data::TokenizerSpec(ds.meta()) + " (" + std::to_string(ds.vocab_size()) + " ids" +
                  (ds.meta() ? "" : ", a flat token file") + "); the model was " + "trained with " +
                  known->from + "'s (" + known->spec + ", " + std::to_string(known->vocab_size) +
                  " ids)");
  const size_t max_windows = a.max_tokens > 0 ? size_t(a.max_tokens) / size_t(T) : 0;
  if (a.max_tokens > 0 && max_windows == 0)
    ThrowBadInput("eval: --max-tokens " + std::to_string(a.max_tokens) +
                  " is less than one window of --seq-len " + std::to_string(T));
  p->plan = train::PlanEval(ds, T, B, max_windows, data);

  const DType dtype = p->dtype = precision == "bf16" ? DType::kBF16 : DType::kF32;
  // Sized before the model's buffers exist, as keel train sizes a run.
  CheckAllocation(
      "eval: --batch " + std::to_string(B) + " windows of --seq-len " + std::to_string(T) + " (" +
          precision + ")",
      double(model::PlanActivations(cfg, B, T, dtype, model::Recompute::kNone).total_bytes) +
          double(m.weights.size()) * (4.0 + double(DTypeSize(dtype))));
  p->B = B;
  p->model = std::make_unique<model::Transformer>(cfg, dtype, B, T, model::Recompute::kNone);
  // A loss-masked dataset's rows pack whole conversations, each attending to itself only, as in
  // training.
  if (ds.masked()) p->model->SetDocumentMask(ds.eos_id());
  std::copy(m.weights.begin(), m.weights.end(), p->model->master());
  p->model->SyncWorking();
  return p;
}

void Run(const Args& a) {
  auto comm = parallel::CreateComm();
  // A rank that cannot read the model or the data stops every rank, said once (the others would
  // wait in the evaluation's first collective for good).
  std::unique_ptr<Prepared> p;
  std::optional<Error> bad;
  try {
    p = Prepare(a);
  } catch (const Error& e) {
    bad = e;
  }
  train::ShareError(*comm, bad);
  const ckpt::LoadedModel& m = p->m;
  const model::ModelConfig& cfg = m.config;
  const std::string& data = p->data;
  const std::string& precision = p->precision;
  const int T = p->T, B = p->B;
  const DType dtype = p->dtype;
  const data::TokenDataset& ds = *p->ds;
  const train::EvalPlan& plan = p->plan;
  model::Transformer& model = *p->model;
  const train::EvalResult r = train::Evaluate(
      ds, plan, *comm, comm->rank(), comm->size(),
      [&](const int32_t* t, const int32_t* y) { return model.Forward(t, y); },
      !a.json && isatty(2));
  if (!std::isfinite(r.loss)) {
    // A number that is not one is an error, not a result; the weights are the usual culprit.
    std::string where = std::string("the weights are finite: the forward overflowed") +
                        (dtype == DType::kBF16 ? " (try --precision fp32)" : "");
    const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
    for (const model::ParamInfo& p : layout.params()) {
      const auto first = std::find_if(m.weights.begin() + long(p.offset),
                                      m.weights.begin() + long(p.offset + p.numel),
                                      [](float w) { return !std::isfinite(w); });
      if (first == m.weights.begin() + long(p.offset + p.numel)) continue;
      where = "the weights are not finite: " + p.name + "[" +
              std::to_string(first - (m.weights.begin() + long(p.offset))) + "] is " +
              std::to_string(*first) + " (the first such element)";
      break;
    }
    throw Error(ExitCode::kRuntime,
                "eval: " + a.source + ": the loss is " + std::to_string(r.loss) + "; " + where,
                /*quiet=*/comm->rank() != 0);
  }
  if (comm->rank() != 0) return;
  if (a.json) {
    const nlohmann::json j = {{"source", a.source},
                              {"data", data},
                              {"family", model::FamilyName(cfg.family)},
                              {"loss", r.loss},
                              {"perplexity", r.perplexity()},
                              {"tokens", r.tokens},
                              {"windows", r.windows},
                              {"seq_len", T},
                              {"batch", B},
                              {"precision", precision},
                              {"ranks", comm->size()},
                              {"seconds", r.seconds}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "%s on %s: loss %.6f, perplexity %.4g over %zu tokens (%zu windows of %d, %s, %d "
      "rank%s, %.1f s)\n",
      a.source.c_str(), data.c_str(), r.loss, r.perplexity(), r.tokens, r.windows, T,
      precision.c_str(), comm->size(), comm->size() == 1 ? "" : "s", r.seconds);
}

}  // namespace

void RegisterEval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Loss and perplexity of a model on a dataset");
  cmd->footer(
      "Examples:\n"
      "  keel eval runs/quickstart                         # its newest checkpoint on its [data] "
      "val\n"
      "  keel eval runs/quickstart/checkpoints/step_00000200 --max-tokens 100000 --json\n"
      "  mpirun -np 4 keel eval model.safetensors --data data/brown/val --seq-len 256\n"
      "The whole split (or its first --max-tokens) in fixed windows of --seq-len + 1 tokens at a\n"
      "stride of --seq-len, so every token after the first is predicted once: the same number for\n"
      "any rank count. A run's periodic validation uses the first val_batches x batch_size of\n"
      "these windows in micro-batches: keel eval with that --max-tokens and --batch prints it.\n"
      "A loss-masked dataset (keel data prepare --format chat) is read in rows packed by\n"
      "conversation, and the loss is the mean over the tokens its mask trains on.\n"
      "Unset flags come from the source's run (config.toml), else the model (fp32, its context).");
  static Args a;
  cmd->add_option("source", a.source, "run folder, checkpoint folder, or model file")->required();
  cmd->add_option("--data", a.data, "dataset folder or token file (default: the run's [data] val)");
  cmd->add_option("--seq-len", a.seq_len, "window length (default: the run's, else the context)");
  cmd->add_option("--batch", a.batch, "windows per forward pass (default: the run's micro-batch)");
  cmd->add_option("--max-tokens", a.max_tokens, "evaluate the first N tokens' windows (0 = all)");
  cmd->add_option("--precision", a.precision, "fp32 or bf16 (default: the run's, else fp32)");
  cmd->add_option("--adapter", a.adapter,
                  "a PEFT LoRA adapter folder merged into the model first (keel ckpt export "
                  "--adapter writes one)");
  cmd->add_flag("--json", a.json, "one JSON object on stdout");
  cmd->callback([] { Run(a); });
}

}  // namespace keel::cli
