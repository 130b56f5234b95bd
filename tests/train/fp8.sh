#!/usr/bin/env bash
# fp8 block products, emulated on the CPU (train.precision = "fp8"; model/fp8_products.h):
#  1. a 4-layer tiny GPT-2 and Llama train in fp8 (blocks 1 and 2; blocks 0 and 3 stay bf16): the
#     fp8 run's loss differs from the bf16 run's (the emulation is on) and the mean of its last 10
#     steps' losses is within 1% of the bf16 run's;
#  2. the numbers, against tests/reference/fp8_reference.py: a run recorded with KEEL_FP8_RECORD
#     under delayed scaling with a small spike limit (history 2, spike 1.25: blocks fall back):
#     every recorded view bitwise equal to an independent rounding at the reference scale, every
#     tracker judgement replayed; each fallback is one fp8_fallback event, and the metrics'
#     fp8_blocks counts the blocks left;
#  3. data, tensor and context parallelism: at dp 2, tp 2 and cp 2 the ranks judge the amaxes
#     reduced over their groups, so they make the same judgements and fall back alike (each saw
#     other micro-batches, shards or tokens); at tp 2 and cp 2 every step's loss is within 0.5%
#     of the one-rank fp8 run's;
#  2b. a stop and resume (delayed recipe, a block fallen back before the stop) ends bitwise as the
#     uninterrupted run: the trackers' histories and fallbacks are in the checkpoint;
#  4. bad input: an unknown recipe, a negative spike: exit 2, one line naming the key.
#   tests/train/fp8.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
        --set model.n_layer=4 --set train.batch_size=8 --set optim.lr=3e-3
        --set train.log_every=10 --set checkpoint.every_minutes=0)
source "$src/tests/train/run_lib.sh"

# 1. fp8 trains like bf16.
for model in gpt2-tiny llama-tiny; do
  run "${model}_bf16" 1 --set model.name="$model" --set train.precision=bf16
  run "${model}_fp8" 1 --set model.name="$model" --set train.precision=fp8
  grep -q "fp8 block products" "$tmp/${model}_fp8.log" ||
    { echo "$model: no fp8 line in the log"; cat "$tmp/${model}_fp8.log"; exit 1; }
  /usr/bin/python3 - "$model" "$tmp/${model}_bf16/metrics.jsonl" "$tmp/${model}_fp8/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return [d["loss"] for d in map(json.loads, open(path)) if "loss" in d and "step" in d]
model, ref, got = sys.argv[1], losses(sys.argv[2]), losses(sys.argv[3])
assert len(ref) == len(got) == 40, (len(ref), len(got))
assert ref != got, "the fp8 run's losses equal the bf16 run's: the fp8 rounding did nothing"
a, b = sum(ref[-10:]) / 10, sum(got[-10:]) / 10
diff = max(abs(x - y) / x for x, y in zip(ref, got))
print(f"{model}: fp8 loss (last 10 steps' mean) {b:.4f}, bf16 {a:.4f}: {100 * abs(b - a) / a:.2f}%"
      f" (limit 1%); largest step difference {100 * diff:.2f}%")
sys.exit(abs(b - a) / a > 0.01)
PY
done

# 2. The numbers, recorded and checked by the reference; blocks fall back.
recipe=(--set train.precision=fp8 --set train.fp8_recipe=delayed --set train.fp8_amax_history=2
        --set train.fp8_spike=1.25)
KEEL_FP8_RECORD="$tmp/record" KEEL_FP8_RECORD_VIEWS=30 run recorded 1 "${recipe[@]}"
/usr/bin/python3 "$src/tests/reference/fp8_reference.py" "$tmp/record" delayed 2 1.25
/usr/bin/python3 - "$tmp/record" "$tmp/recorded" <<'PY'
import glob, json, sys
record, run = sys.argv[1], sys.argv[2]
judged = [json.loads(l) for f in glob.glob(record + "/steps.*.jsonl") for l in open(f)]
fell = sorted({(r["step"], r["layer"]) for r in judged if r["fallback"]})
first = {}
for step, layer in fell:
    first.setdefault(layer, step)
events = [e for e in map(json.loads, open(run + "/events.jsonl")) if e["event"] == "fp8_fallback"]
got = sorted((e["step"], int(e["why"].split()[1])) for e in events)
want = sorted((s, l) for l, s in first.items())
assert got == want, f"fp8_fallback events {got}, the record's first fallbacks {want}"
assert want, "no block fell back with spike 1.25: the test proves nothing about fallbacks"
metrics = {d["step"]: d for d in map(json.loads, open(run + "/metrics.jsonl")) if "step" in d}
for step, d in metrics.items():
    left = 2 - sum(1 for s in first.values() if s <= step)
    assert d.get("fp8_blocks") == left, f"step {step}: fp8_blocks {d.get('fp8_blocks')}, want {left}"
print(f"fallbacks: {len(events)} fp8_fallback events at steps {[s for s, _ in got]}, one per "
      f"block, as the record judged; fp8_blocks counts down to {left}")
PY

# 2b. A resume goes on with the trackers' histories and the blocks' fallbacks (an own checkpoint
# tensor): stopped at step 10, after a block fell back and with delayed scales in use, and
# resumed, the run ends with the uninterrupted (recorded) run's weights, bitwise.
run resumed 1 "${recipe[@]}" --set train.stop_at=10
run resumed 1 "${recipe[@]}" --resume auto
grep -q "resuming from .*step_00000010" "$tmp/resumed.log" || { cat "$tmp/resumed.log"; exit 1; }
! grep -q "tracker state" "$tmp/resumed.log" || { echo "resumed: trackers started afresh"; exit 1; }
same recorded resumed "fp8 (delayed, a block fallen back) stopped at 10 and resumed"

# 3. Ranks judge alike: at dp 2 (each replica saw its own micro-batches), tp 2 (its own shards)
# and cp 2 (its own chunks of the sequences) both ranks' judgements are the same lines.
same_judgements() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import glob, sys
files = sorted(glob.glob(sys.argv[1] + "/steps.*.jsonl"))
assert len(files) == 2, files
a, b = (open(f).read() for f in files)
assert a and a == b, f"{sys.argv[2]}: the two ranks judged different amaxes or fell back differently"
lines = a.splitlines()
falls = sum(1 for line in lines if '"fallback": true' in line)
print(f"{sys.argv[2]}: both ranks made the same {len(lines)} judgements, {falls} of them fallbacks")
PY
}
KEEL_FP8_RECORD="$tmp/record_dp2" KEEL_FP8_RECORD_VIEWS=0 run dp2 2 "${recipe[@]}"
same_judgements "$tmp/record_dp2" "dp 2"
KEEL_FP8_RECORD="$tmp/record_tp2" KEEL_FP8_RECORD_VIEWS=0 run tp2 2 --set train.precision=fp8 \
  --set parallel.tp=2
same_judgements "$tmp/record_tp2" "tp 2"
close tp2 gpt2-tiny_fp8
KEEL_FP8_RECORD="$tmp/record_cp2" KEEL_FP8_RECORD_VIEWS=0 run cp2 2 --set train.precision=fp8 \
  --set parallel.cp=2
same_judgements "$tmp/record_cp2" "cp 2"
close cp2 gpt2-tiny_fp8

# 4. Bad input.
refused fp8_recipe 1 "train.fp8_recipe" --set train.precision=fp8 --set train.fp8_recipe=sometimes
refused fp8_spike 1 "train.fp8_spike" --set train.precision=fp8 --set train.fp8_spike=-1
