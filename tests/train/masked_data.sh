#!/usr/bin/env bash
# Loss-masked (chat) data end to end, on examples/chat/arithmetic.jsonl:
#  1. keel data prepare --format chat writes a dataset whose mask trains on about a third of the
#     tokens; keel data verify checks the masks;
#  2. the trained losses are the mean over the assistant's tokens (metrics' scored_tokens, fewer
#     than the step's tokens) and fall;
#  3. layout equivalence: dp 2 with 2 micro-batches per rank gives one process's losses within
#     1e-5 (each rank counts the whole global batch's trained targets, with no collective);
#  4. exact resume: stop at step 10, resume to 20: bitwise the losses of the run that never stopped;
#  5. keel eval of the run on the val split prints the trainer's final validation loss;
#  6. keel generate --chat answers in one line (the plain template's turn ends at the eos);
#  7. a split with no trained target in its windows is refused by keel eval (not loss 0);
#  8. a run on cl100k data generates with cl100k (its meta.json); eval refuses a GPT-2 split and
#     generate GPT-2's tokenizer (the default for a bare model file); keel train refuses a val
#     split of another tokenizer than its training data.
#   tests/train/masked_data.sh KEEL_BINARY SOURCE_DIR
set -euo pipefail
keel=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$keel" data prepare "$src/examples/chat/arithmetic.jsonl" --format chat --out "$tmp/chat" \
  --val-fraction 0.1 >"$tmp/prepare.log"
grep -q "trained on: " "$tmp/prepare.log" || { cat "$tmp/prepare.log"; exit 1; }
"$keel" data verify "$tmp/chat/train" >/dev/null
common=(--set data.train="$tmp/chat/train" --set data.val="$tmp/chat/val" --set data.seq_len=64
        --set train.out_dir="$tmp" --set train.steps=20 --set train.batch_size=8
        --set optim.lr=3e-3 --set train.val_batches=2)
run() {  # NAME [LAUNCHER...] -- [ARGS...]
  local name=$1; shift
  local launch=()
  while [[ $1 != -- ]]; do launch+=("$1"); shift; done; shift
  OMP_NUM_THREADS=1 "${launch[@]}" "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" \
    --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}
run single --
run dp mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 -- \
  --set train.micro_batch_size=2
run resumed -- --set train.stop_at=10
run resumed -- --resume auto
reply=$("$keel" generate --run "$tmp/single" --chat --prompt "What is 3 plus 4?" --temperature 0 \
  --max-tokens 12)
[[ -n $reply && $(wc -l <<<"$reply") == 1 ]] || { echo "generate --chat replied: '$reply'"; exit 1; }
rc=0
"$keel" generate --run "$tmp/single" --system "Be brief." --prompt x >/dev/null 2>"$tmp/err" || rc=$?
[[ $rc == 2 ]] && grep -q -- "--system needs --chat" "$tmp/err" || { echo "rc $rc"; cat "$tmp/err"; exit 1; }
OMP_NUM_THREADS=1 "$keel" eval "$tmp/single" --max-tokens $((2 * 8 * 64)) --batch 8 --json \
  >"$tmp/eval.json"

/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl")]
ref, dp, res = rows("single"), rows("dp"), rows("resumed")
assert len(ref) == len(dp) == len(res) == 20, (len(ref), len(dp), len(res))
for r in ref:
    assert 0 < r["scored_tokens"] < 8 * 64, f"step {r['step']}: scored_tokens {r.get('scored_tokens')}"
losses = [r["loss"] for r in ref]
assert losses[-1] < losses[0] - 1.5, f"the masked loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(dp, ref))
print(f"dp 2 x 2 micro-batches: max relative loss difference {worst:.2e} (limit 1e-5)")
assert worst <= 1e-5
assert [r["loss"] for r in res] == losses, "the resumed run's losses differ"
assert [r["scored_tokens"] for r in dp] == [r["scored_tokens"] for r in ref]
val = [r["val_loss"] for r in ref if r.get("val_loss", -1) >= 0]
ev = json.load(open(f"{d}/eval.json"))
print(f"losses {losses[0]:.4f} -> {losses[-1]:.4f}; trainer's validation {val[-1]!r}, keel eval {ev['loss']!r}")
assert abs(ev["loss"] - val[-1]) <= 1e-6 * abs(val[-1]), "keel eval disagrees with the trainer"
PY

# 7. A masked split with no trained target in its windows (every reply is past seq_len + 1 tokens)
# is refused rather than scored as loss 0, perplexity 1.
rc=0
"$keel" eval "$tmp/single" --seq-len 4 >"$tmp/err" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "no target the loss mask trains on" "$tmp/err" ||
  { echo "eval --seq-len 4: exit $rc"; cat "$tmp/err"; exit 1; }
echo "refused: $(cat "$tmp/err")"

# 8. A run on data of another tokenizer (cl100k): generate encodes and decodes with it (its
# meta.json says which) and its chat template; eval refuses a GPT-2 split whose ids fit.
"$keel" data prepare "$src/examples/chat/arithmetic.jsonl" --format chat --tokenizer cl100k \
  --out "$tmp/chat100k" --val-fraction 0.1 >"$tmp/prepare100k.log"
run cl100k -- --set data.train="$tmp/chat100k/train" --set data.val="$tmp/chat100k/val" \
  --set model.vocab_size=100277 --set train.steps=2 --set train.sample_count=1
ask=(generate --run "$tmp/cl100k" --chat --prompt "What is 3 plus 4?" --temperature 0
     --max-tokens 6)
own=$("$keel" "${ask[@]}")
given=$("$keel" "${ask[@]}" --tokenizer cl100k)
[[ $own == "$given" ]] || { echo "generate: '$own' with the run's tokenizer, '$given' with cl100k"; exit 1; }
rc=0
"$keel" eval "$tmp/cl100k" --data "$tmp/chat/val" >"$tmp/err" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "holds ids of the tokenizer gpt2 (50257 ids)" "$tmp/err" ||
  { echo "eval of a GPT-2 split with a cl100k model: exit $rc"; cat "$tmp/err"; exit 1; }
echo "refused: $(cat "$tmp/err")"
# Its model file beside its run's config.toml generates with cl100k too; copied out of the run it
# says nothing of a tokenizer: GPT-2's, the default, does not fit its vocabulary and is refused,
# naming both sizes.
in_run=$("$keel" generate --run "$tmp/cl100k/model.safetensors" --chat --prompt "What is 3 plus 4?" \
  --temperature 0 --max-tokens 6)
[[ $in_run == "$own" ]] || { echo "generate from the run's model file: '$in_run', not '$own'"; exit 1; }
cp "$tmp/cl100k/model.safetensors" "$tmp/bare.safetensors"
rc=0
"$keel" generate --run "$tmp/bare.safetensors" --prompt x >"$tmp/err" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "has 50257 ids, the model's vocabulary 100277" "$tmp/err" ||
  { echo "generate from a cl100k model file with GPT-2's tokenizer: exit $rc"; cat "$tmp/err"; exit 1; }
echo "refused: $(cat "$tmp/err")"
# A run whose validation split is of another tokenizer than its training data (ids that both fit
# a vocabulary of 100277) is refused before anything is written.
rc=0
OMP_NUM_THREADS=1 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=mixed \
  --set model.vocab_size=100277 --set data.val="$tmp/chat100k/val" >"$tmp/err" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "\[data\] val .* was prepared with the tokenizer cl100k_base (100277 ids" \
  "$tmp/err" && [[ ! -e $tmp/mixed ]] ||
  { echo "train on GPT-2 data with a cl100k val split: exit $rc"; cat "$tmp/err"; exit 1; }
echo "refused: $(cat "$tmp/err")"
