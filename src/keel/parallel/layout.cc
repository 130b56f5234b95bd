#include "keel/parallel/layout.h"

#include <utility>

#include "keel/core/error.h"

namespace keel::parallel {
namespace {

std::string S(long v) { return std::to_string(v); }

std::string List(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + S(x);
  return "{" + s + "}";
}

}  // namespace

void Layout::Validate(const LayoutInputs& in, const std::string& prefix) const {
  ValidateRanks(in, prefix);
  if (in.global_batch) {
    const long micro = micro_batch > 0 ? micro_batch : 1;
    const long unit = long(dp) * micro;
    if (in.global_batch % unit != 0)
      ThrowBadInput(prefix + "global batch " + S(in.global_batch) + " is not divisible by dp=" +
                    S(dp) + " x micro-batch " + S(micro) + " = " + S(unit));
  }
  ValidateSchedule(in, prefix);
}

void Layout::ValidateRanks(const LayoutInputs& in, const std::string& prefix) const {
  // tp and pp first: a derived dp is only meaningful once they are.
  for (auto [name, v] :
       {std::pair{"tp", tp}, std::pair{"pp", pp}, std::pair{"cp", cp}, std::pair{"dp", dp}})
    if (v < 1) ThrowBadInput(prefix + name + "=" + S(v) + ": expected an integer >= 1");
  if (zero < 0 || zero > 3) ThrowBadInput(prefix + "zero=" + S(zero) + ": expected 0, 1, 2 or 3");
  const long ranks = long(tp) * pp * cp * dp;
  if (in.world && ranks != in.world)
    ThrowBadInput(prefix + "tp=" + S(tp) + " x pp=" + S(pp) + (cp > 1 ? " x cp=" + S(cp) : "") +
                  " x dp=" + S(dp) + " = " + S(ranks) + " does not match the " + S(in.world) +
                  " ranks launched");
  if (in.n_head && in.n_head % tp != 0)
    ThrowBadInput(prefix + "tp=" + S(tp) + " does not divide model.n_head=" + S(in.n_head) +
                  " (each rank holds whole heads)");
  if (in.n_kv_head && in.n_kv_head % tp != 0)
    ThrowBadInput(prefix + "tp=" + S(tp) + " does not divide model.n_kv_head=" + S(in.n_kv_head) +
                  " (each rank holds whole key/value heads)");
  if (in.ffn_hidden && in.ffn_hidden % tp != 0)
    ThrowBadInput(prefix + "tp=" + S(tp) + " does not divide model.ffn_hidden=" + S(in.ffn_hidden) +
                  " (each rank holds whole hidden units)");
  if (in.padded_vocab && in.padded_vocab % tp != 0)
    ThrowBadInput(prefix + "tp=" + S(tp) + " does not divide model.vocab_size padded to " +
                  S(in.padded_vocab) + " (each rank holds whole rows of the embedding)");
  if (stage_layers.empty()) {
    if (in.n_layer && in.n_layer % pp != 0)
      ThrowBadInput(prefix + "pp=" + S(pp) + " does not divide model.n_layer=" + S(in.n_layer) +
                    " (each stage holds whole layers)");
    return;
  }
  // Uneven stages: one list entry per stage, each at least one block, the model's blocks in all.
  const std::string list = prefix + "stage_layers " + List(stage_layers);
  if (virtual_stages > 1)
    ThrowBadInput(list + ": uneven stages do not interleave; expected virtual_stages=1, got " +
                  S(virtual_stages));
  long sum = 0;
  for (int n : stage_layers) {
    if (n < 1) ThrowBadInput(list + ": expected at least 1 layer per stage");
    sum += n;
  }
  if (long(stage_layers.size()) != pp || (in.n_layer && sum != in.n_layer))
    ThrowBadInput(list + " gives " + S(long(stage_layers.size())) + " stage(s) of " + S(sum) +
                  " layers in all; the layout has pp=" + S(pp) +
                  " and model.n_layer=" + S(in.n_layer));
}

void Layout::ValidateSchedule(const LayoutInputs& in, const std::string& prefix) const {
  if (sp && tp == 1)
    ThrowBadInput(prefix +
                  "sp=true splits the sequence over the tensor-parallel group: it needs "
                  "tp > 1 (got tp=1)");
  // Context parallelism: 2·cp chunks per sequence (parallel/zigzag.h).
  if (cp > 1 && in.seq_len && in.seq_len % (2L * cp) != 0)
    ThrowBadInput(prefix + "cp=" + S(cp) + " cuts each sequence into 2 x cp = " + S(2L * cp) +
                  " chunks: data.seq_len=" + S(in.seq_len) + " is not divisible by " + S(2L * cp));
  const long local_T = in.seq_len / cp;
  if (sp && in.seq_len && (long(micro_batch) * local_T) % tp != 0)
    ThrowBadInput(prefix + "sp=true splits each micro-batch's " + S(micro_batch) + " x " +
                  S(local_T) + " tokens over tp=" + S(tp) +
                  " ranks: they must divide evenly (train.micro_batch_size x data.seq_len" +
                  (cp > 1 ? " / cp" : "") + ")");
  const int v = virtual_stages;
  if (v < 1) ThrowBadInput(prefix + "virtual_stages=" + S(v) + ": expected an integer >= 1");
  if (v > 1 && pp == 1)
    ThrowBadInput(prefix + "virtual_stages=" + S(v) +
                  " interleaves pipeline stages: it needs pp > 1 (got pp=1)");
  if (v > 1 && in.n_layer && in.n_layer % (long(pp) * v) != 0)
    ThrowBadInput(prefix + "pp=" + S(pp) + " x virtual_stages=" + S(v) + " = " + S(long(pp) * v) +
                  " does not divide model.n_layer=" + S(in.n_layer) +
                  " (each chunk holds whole layers)");
  if (pp > 1) {
    // DeepSpeed refuses the same: stages 2 and 3 reduce gradients per micro-batch, and the tied
    // embedding's gradient, summed between the first and last stage after the step's backward,
    // would be sharded differently on the two.
    if (zero >= 2)
      ThrowBadInput(prefix + "zero=" + S(zero) + " with pp=" + S(pp) +
                    ": pipeline stages take ZeRO 0 or 1 (set parallel.zero=1 to shard the "
                    "optimizer state)");
    const long batch = in.global_batch ? in.global_batch : long(dp) * micro_batch * n_micro;
    if (n_micro < pp)
      ThrowBadInput(prefix + "pp=" + S(pp) + " needs at least " + S(pp) +
                    " micro-batches per step for the 1F1B schedule, got " + S(n_micro) +
                    " (train.batch_size " + S(batch) + " / dp " + S(dp) +
                    " / train.micro_batch_size " + S(micro_batch) +
                    "); lower train.micro_batch_size");
    // The interleaved schedule sends groups of pp micro-batches through the chunks in turn.
    if (v > 1 && n_micro % pp != 0)
      ThrowBadInput(prefix + "virtual_stages=" + S(v) + " needs the micro-batches per step (" +
                    S(n_micro) + ") to be a multiple of pp=" + S(pp));
  }
}

}  // namespace keel::parallel
