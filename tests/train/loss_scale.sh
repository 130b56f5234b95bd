#!/usr/bin/env bash
# Dynamic loss scaling through `keel train` ([loss_scale] kind = "dynamic"), and fp16 with it:
#  1. scaling does not change the math: with no overflow, a run with the scaler ends with the
#     weights of a run without it, bitwise (fp32; the scale is a power of two);
#  2. injected overflows (KEEL_FAULT nan_grad) give the reference scaler's sequence: each step's
#     loss_scale and skipped flag in metrics.jsonl equal those of a Python re-implementation of
#     Megatron-LM's DynamicGradScaler fed the same overflows; the run reaches the minimum scale,
#     says so, and finishes (no abort); in fp32 and in fp16 (train.precision = "fp16");
#  3. a stop and --resume auto with the scaler mid-sequence gives the uninterrupted run's
#     weights bitwise (the scaler's state is in the checkpoint), in both;
#  4. fp16 trains: with the default kind = "auto" (dynamic for fp16) its loss after 30 steps is
#     within 3% of the bf16 run's; under tensor parallelism (tp 2, and with sequence
#     parallelism: the tp sums of fp16 activations add in fp32) every step's loss is within 1e-4
#     of the one-rank fp16 run's; fp16 without scaling is refused;
#  5. the switch: overflows that persist at the minimum scale ([loss_scale] switch_after in a row)
#     switch an fp16 run to bf16 with an event, a checkpoint and a metrics field, and it
#     finishes; a stop after the switch and --resume auto with the same fp16 config stays in bf16
#     and ends with the uninterrupted run's weights bitwise;
#  6. with no switch to come, overflows at the minimum are the non-finite guard's (it stops a
#     run with stop_on_nonfinite instead of skipping every step).
#   tests/train/loss_scale.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=30
        --set optim.lr=3e-3 --set train.log_every=10 --set checkpoint.every_minutes=0)
scaled=(--set loss_scale.kind=dynamic --set loss_scale.initial=1024 --set loss_scale.min=128
        --set loss_scale.growth_interval=4 --set loss_scale.hysteresis=2)
source "$src/tests/train/run_lib.sh"

run plain 1
run scaled 1 "${scaled[@]}"
cmp -s "$tmp/plain/model.safetensors" "$tmp/scaled/model.safetensors" ||
  { echo "the scaler changed the weights of a run without overflows"; exit 1; }
echo "no overflow: scaled = unscaled, bitwise"

# 0-based steps whose gradients are NaN on rank 0: one tolerated, backoffs, growth, then a run of
# overflows at the minimum.
over=(3 4 9 10 11 12 13 14 15 16 17 18 19 20)
fault=""
for s in "${over[@]}"; do fault+="nan_grad@$s:0; "; done
for prec in fp32 fp16; do
  # fp32 has no switch to come: its overflows at the minimum are the non-finite guard's, which
  # skips them like the scaler (part 6) when no rollback is due.
  p=(--set train.precision=$prec --set resilience.max_skips=100)
  KEEL_FAULT="$fault" run "faults_$prec" 2 "${scaled[@]}" "${p[@]}"
  KEEL_FAULT="$fault" run "cut_$prec" 2 "${scaled[@]}" "${p[@]}" --set train.stop_at=12
  KEEL_FAULT="$fault" run "cut_$prec" 2 "${scaled[@]}" "${p[@]}" --resume auto
  grep -q "resuming from .*step_00000012" "$tmp/cut_$prec.log" ||
    { echo "cut_$prec did not resume"; exit 1; }
  cmp -s "$tmp/faults_$prec/model.safetensors" "$tmp/cut_$prec/model.safetensors" ||
    { echo "loss scaling, $prec: final weights differ after a stop and resume"; exit 1; }
  echo "$prec: stop at 12 and resume: bitwise"
  grep -q "overflowed at the minimum loss scale" "$tmp/faults_$prec.log" ||
    { echo "$prec: no line about the minimum scale"; cat "$tmp/faults_$prec.log"; exit 1; }

  /usr/bin/python3 - "$tmp/faults_$prec" "${over[*]}" <<'PY'
import json, sys
d, over = sys.argv[1], {int(s) for s in sys.argv[2].split()}
# Megatron-LM's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py), scalar form.
scale, min_scale, growth, backoff, interval, hyst = 1024.0, 128.0, 2.0, 0.5, 4, 2
growth_tracker, hyst_tracker = 0, hyst
want = []
for step in range(30):
    found_inf = step in over
    want.append((scale, found_inf))
    if found_inf:
        growth_tracker = 0
        hyst_tracker -= 1
        if hyst_tracker <= 0:
            scale = max(scale * backoff, min_scale)
    else:
        growth_tracker += 1
        if growth_tracker == interval:
            growth_tracker, hyst_tracker = 0, hyst
            scale *= growth
got = [(r["loss_scale"], r.get("skipped", False))
       for r in map(json.loads, open(f"{d}/metrics.jsonl"))]
assert len(got) == 30, f"{len(got)} steps recorded, expected 30"
bad = [(i + 1, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
for step, g, w in bad:
    print(f"step {step}: keel (scale, skipped) {g}, reference {w}")
print(d.rsplit("_", 1)[1] + ": scales:", " ".join(f"{s:g}" for s, _ in got))
print(f"{sum(s for _, s in got)} skipped steps; the sequence {'differs' if bad else 'matches'}")
events = [json.loads(l) for l in open(f"{d}/events.jsonl")]
overflows = [e["step"] for e in events if e["event"] == "loss_scale_overflow"]
assert overflows == sorted(s + 1 for s in over), overflows
assert any(e["event"] == "loss_scale_at_minimum" for e in events)
sys.exit(1 if bad else 0)
PY
done

# fp16 with the default scaler (kind = "auto": dynamic from 65536) against bf16.
run bf16 1 --set train.precision=bf16
run fp16 1 --set train.precision=fp16
grep -q "fp16: products run in fp32" "$tmp/fp16.log" || { echo "fp16: no start line"; exit 1; }
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
last = {k: json.loads(open(f"{d}/{k}/metrics.jsonl").readlines()[-1]) for k in ("bf16", "fp16")}
rel = abs(last["fp16"]["loss"] - last["bf16"]["loss"]) / last["bf16"]["loss"]
print(f"fp16: loss at step 30 {last['fp16']['loss']:.4f}, bf16 {last['bf16']['loss']:.4f} "
      f"({100 * rel:.2f}%, limit 3%); loss scale {last['fp16']['loss_scale']:g}")
assert "loss_scale" in last["fp16"] and "loss_scale" not in last["bf16"]
sys.exit(rel > 0.03)
PY
run fp16_tp 2 --set train.precision=fp16 --set parallel.tp=2
run fp16_sp 2 --set train.precision=fp16 --set parallel.tp=2 --set parallel.sp=true
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{name}/metrics.jsonl"))
            if "loss" in r and "step" in r}
one = losses("fp16")
for name in ("fp16_tp", "fp16_sp"):
    got = losses(name)
    assert got.keys() == one.keys() and len(one) == 30, (sorted(got), sorted(one))
    rel = max(abs(got[s] - one[s]) / one[s] for s in one)
    print(f"{name}: every step's loss within {rel:.1e} of one rank's (limit 1e-4)")
    assert rel <= 1e-4, name
PY
# Overflows at 0-based steps 3..9: the scale reaches its minimum at step 7 (1-based), and steps
# 8, 9, 10 overflow there: with switch_after = 3 the run switches after step 10.
fault=""
for s in 3 4 5 6 7 8 9; do fault+="nan_grad@$s:0; "; done
sw=(--set train.precision=fp16 "${scaled[@]}" --set loss_scale.switch_after=3)
KEEL_FAULT="$fault" run sw 1 "${sw[@]}"
KEEL_FAULT="$fault" run swcut 1 "${sw[@]}" --set train.stop_at=20
KEEL_FAULT="$fault" run swcut 1 "${sw[@]}" --resume auto
grep -q "switching to bf16" "$tmp/sw.log" || { echo "sw: no switch"; cat "$tmp/sw.log"; exit 1; }
grep -q "resuming from .*step_00000010" "$tmp/sw.log" ||
  { echo "sw: did not go on from the switch's checkpoint"; cat "$tmp/sw.log"; exit 1; }
grep -q "switched from fp16 to bf16 at step 10" "$tmp/swcut.log" ||
  { echo "swcut: the resume did not stay in bf16"; cat "$tmp/swcut.log"; exit 1; }
cmp -s "$tmp/sw/model.safetensors" "$tmp/swcut/model.safetensors" ||
  { echo "switch: final weights differ after a stop and resume"; exit 1; }
echo "switch: stop at 20 and resume in bf16: bitwise"
/usr/bin/python3 - "$tmp/sw" <<'PY'
import json, math, sys
d = sys.argv[1]
rows = {r["step"]: r for r in map(json.loads, open(f"{d}/metrics.jsonl"))}
events = [json.loads(l) for l in open(f"{d}/events.jsonl")]
switch = [e for e in events if e["event"] == "precision_switch"]
assert [e["step"] for e in switch] == [10], switch
assert all(rows[s]["precision"] == "fp16" for s in range(1, 11)), [rows[s] for s in range(1, 11)]
assert all(rows[s]["precision"] == "bf16" for s in range(11, 31)), [rows[s] for s in range(11, 31)]
assert all(math.isfinite(rows[s]["loss"]) for s in rows) and len(rows) == 30
print(f"switch: fp16 to bf16 after step 10 ({switch[0]['overflows_at_minimum']} overflows at the "
      f"minimum); loss at step 30 {rows[30]['loss']:.4f}")
PY
# 6. With no switch to come (bf16 under dynamic scaling; fp16 with switch_after = 0), overflows
# at the minimum are the non-finite guard's: stop_on_nonfinite stops the run (NaN gradients of
# another cause once skipped every step to an exit 0). Overflows at 0-based steps 3..11: the
# second backs off to the minimum, the third is judged.
fault=""
for s in 3 4 5 6 7 8 9 10 11; do fault+="nan_grad@$s:0; "; done
for stuck in "bf16 16" "fp16 0"; do
  read -r prec after <<<"$stuck"
  rc=0
  KEEL_FAULT="$fault" OMP_NUM_THREADS=1 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" \
    --set train.name="stuck_$prec" --set train.steps=12 --set train.precision=$prec \
    "${scaled[@]}" --set loss_scale.initial=256 --set loss_scale.switch_after=$after \
    --set resilience.stop_on_nonfinite=true >"$tmp/stuck_$prec.log" 2>&1 || rc=$?
  grep -q "step 6: .*stop_on_nonfinite = true" "$tmp/stuck_$prec.log" && ((rc == 1)) ||
    { echo "stuck_$prec: exit $rc, expected 1 at step 6:"; cat "$tmp/stuck_$prec.log"; exit 1; }
  echo "$prec, switch_after $after: stopped at step 6 by the guard (exit 1)"
done

refused fp16_unscaled 1 "train.precision" --set train.precision=fp16 --set loss_scale.kind=none

refused bad_kind 1 "loss_scale.kind" --set loss_scale.kind=static
refused bad_backoff 1 "loss_scale.backoff" --set loss_scale.backoff=2
