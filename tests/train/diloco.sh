#!/usr/bin/env bash
# DiLoCo ([parallel] dp_sync = "diloco") through `keel train`, the tiny bf16 GPT over 40 steps:
#  1. one replica with outer lr 1 and momentum 0 is the plain run (the outer step puts the weights
#     back where they are, up to fp32 rounding): every step's loss within 0.01%;
#  2. two replicas, 10 inner steps: every step's loss finite, the last within 2% of (here: below)
#     synchronous data parallelism's at equal tokens, in fp32 and int8 pseudo-gradients; the
#     group sends a tenth of the synchronous run's bytes (int8: a fortieth);
#  3. a stop at step 15 (mid-round) and --resume auto end with the uninterrupted run's weights
#     bitwise (each replica's weights, moments, outer momentum and residual are its own tensors);
#     the checkpoint resumes as a synchronous run (its shared weights are the replicas' common
#     ones), and a synchronous checkpoint as a DiLoCo run, which says its replicas start from it;
#  4. streaming DiLoCo ([diloco] fragments, overlap_steps): one replica with outer lr 1 and
#     momentum 0 is again the plain run (the overlap's own progress is kept, not lost); two
#     replicas in 2 fragments train within 2% of synchronous, with and without 3 steps of
#     overlap, sending 4.5 of the classic run's 4 rounds (seven half-rounds and the last step's
#     whole one); a stop at step 16, with a fragment in flight, resumes bitwise (and at dp 4 in
#     int8 with 3 fragments and 2 steps of overlap), and a resume
#     with another overlap says it lacks the sends of its schedule (and lands none);
#  5. a lost replica (the supervisor's elastic dp: a checkpoint of 2 replicas resumed by 1) is
#     dropped from its round while the one left goes on with its own: its first loss is its own
#     weights' (below the anchor's), its outer momentum is the saved replica 0's bitwise (and
#     four streaming int8 replicas resumed by two keep their residuals); resumed by 2 again, the
#     new replica joins from the anchor with the same outer momentum and a zero residual, and the
#     run trains to within 2% of synchronous;
#  6. ZeRO > 0, tensor parallelism and fp16 are refused with one line, and so is a [diloco] key
#     without dp_sync = "diloco", fragments beyond inner_steps and an overlap of a whole round.
#   tests/train/diloco.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_bf16 "$shared"

compare() {  # compare NAME REF LIMIT MODE: MODE every (each step within LIMIT) or last (<= REF + LIMIT)
  /usr/bin/python3 - "$@" "$tmp" <<'PY'
import json, math, sys
name, ref, limit, mode, tmp = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
def losses(n):
    return {d["step"]: d["loss"] for d in map(json.loads, open(f"{tmp}/{n}/metrics.jsonl"))
            if "loss" in d and "step" in d}
r, g = losses(ref), losses(name)
assert len(r) == 40 and r.keys() == g.keys(), (sorted(r), sorted(g))
assert all(math.isfinite(v) for v in g.values()), g
if mode == "every":
    rel = max(abs(g[s] - r[s]) / r[s] for s in r)
    print(f"{name}: largest step difference from {ref} {100 * rel:.4f}% (limit {100 * limit}%)")
    sys.exit(rel > limit)
rel = (g[40] - r[40]) / r[40]
print(f"{name}: loss at step 40 {g[40]:.4f}, {ref} {r[40]:.4f} ({100 * rel:+.2f}%, limit +{100 * limit}%)")
sys.exit(rel > limit)
PY
}
bytes() {  # bytes NAME REF LO HI: everything the dp group sent over the run, NAME / REF in [LO, HI]
  /usr/bin/python3 - "$@" "$tmp" <<'PY'
import json, sys
name, ref, lo, hi, tmp = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def total(n):
    rows = [json.loads(l) for l in open(f"{tmp}/{n}/metrics.jsonl") if '"ms"' in l]
    return sum(r.get("grad_comm_bytes", 0) + r.get("diloco_bytes", 0) for r in rows)
x = total(name) / total(ref)
print(f"{name}: {total(name) / 1e6:.2f} MB sent per rank in 40 steps, {x:.4f} of {ref}'s "
      f"(expected {lo}..{hi})")
sys.exit(not lo <= x <= hi)
PY
}
diloco=(--set parallel.dp_sync=diloco)

run plain 1
run one 1 "${diloco[@]}" --set diloco.inner_steps=5 --set diloco.outer_lr=1 --set diloco.outer_momentum=0
compare one plain 0.0001 every

run sync 2
run d10 2 "${diloco[@]}" --set diloco.inner_steps=10
grep -q "DiLoCo: the 2 replica(s) train alone for 10 steps" "$tmp/d10.log" ||
  { echo "d10: the start does not say DiLoCo runs"; cat "$tmp/d10.log"; exit 1; }
compare d10 sync 0.02 last
bytes d10 sync 0.099 0.101
run d10i8 2 "${diloco[@]}" --set diloco.inner_steps=10 --set parallel.grad_comm=int8
compare d10i8 sync 0.02 last
bytes d10i8 sync 0.025 0.026

run cut 2 "${diloco[@]}" --set diloco.inner_steps=10 --set parallel.grad_comm=int8 --set train.stop_at=15
run cut 2 "${diloco[@]}" --set diloco.inner_steps=10 --set parallel.grad_comm=int8 --resume auto
grep -q "resuming from .*step_00000015" "$tmp/cut.log" || { echo "cut did not resume"; cat "$tmp/cut.log"; exit 1; }
same d10i8 cut "DiLoCo stopped mid-round at 15 and resumed"
mkdir -p "$tmp/as_sync" && cp -r "$tmp/cut/checkpoints" "$tmp/as_sync/"
run as_sync 2 --set checkpoint.resume="$tmp/cut/checkpoints/step_00000015"
grep -q "resuming from .*step_00000015" "$tmp/as_sync.log" ||
  { echo "as_sync did not resume"; cat "$tmp/as_sync.log"; exit 1; }
run from_sync 2 --set train.stop_at=15
run from_sync 2 "${diloco[@]}" --set diloco.inner_steps=10 --resume auto
grep -q "of the ranks' own tensors .* are not in .*replicas from the checkpoint's shared weights" \
  "$tmp/from_sync.log" || { echo "from_sync: no line about the replicas' start"; cat "$tmp/from_sync.log"; exit 1; }

stream=("${diloco[@]}" --set diloco.inner_steps=10 --set diloco.fragments=2)
run one_s 1 "${stream[@]}" --set diloco.overlap_steps=3 --set diloco.outer_lr=1 \
  --set diloco.outer_momentum=0
compare one_s plain 0.0001 every
run s10 2 "${stream[@]}"
grep -q "streaming DiLoCo: 2 fragment(s), rounds staggered by 5 step(s)" "$tmp/s10.log" ||
  { echo "s10: the start does not say DiLoCo streams"; cat "$tmp/s10.log"; exit 1; }
compare s10 sync 0.02 last
bytes s10 d10 1.12 1.13
run s10o 2 "${stream[@]}" --set diloco.overlap_steps=3
compare s10o sync 0.02 last
bytes s10o d10 1.12 1.13
run scut 2 "${stream[@]}" --set diloco.overlap_steps=3 --set train.stop_at=16
run scut 2 "${stream[@]}" --set diloco.overlap_steps=3 --resume auto
grep -q "resuming from .*step_00000016" "$tmp/scut.log" || { echo "scut did not resume"; cat "$tmp/scut.log"; exit 1; }
same s10o scut "streaming DiLoCo stopped at 16 with a fragment in flight and resumed"
# Four replicas (every one sends to three), int8 fragments with their residuals, 3 fragments and
# 2 steps of overlap: a stop at 14 (fragment 0 in flight since 14) resumes bitwise.
s4=("${diloco[@]}" --set diloco.inner_steps=6 --set diloco.fragments=3 --set diloco.overlap_steps=2
    --set parallel.grad_comm=int8)
run s4 4 "${s4[@]}"
run s4cut 4 "${s4[@]}" --set train.stop_at=14
run s4cut 4 "${s4[@]}" --resume auto
same s4 s4cut "streaming DiLoCo at dp 4 in int8, stopped at 14 with a fragment in flight"
# Resumed with another overlap, the flight saved under the old schedule is not landed.
mkdir -p "$tmp/resched" && cp -r "$tmp/scut/checkpoints" "$tmp/resched/"
run resched 2 "${stream[@]}" --set diloco.overlap_steps=2 \
  --set checkpoint.resume="$tmp/scut/checkpoints/step_00000016"
grep -q "no fragments in flight for this schedule (h10f2t2): fragment(s) 0 (sent at step 15) are dropped" \
  "$tmp/resched.log" || { echo "resched: the start does not say what it drops"; cat "$tmp/resched.log"; exit 1; }

own() {  # own "OP RUN/STEP:TENSOR [RUN/STEP:TENSOR...]"...: OP EQ (all equal the first), ZERO, NONZERO
  /usr/bin/python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, checks = sys.argv[1], sys.argv[2:]
def read(spec):  # RUN/STEP:NAME -> the tensor's bytes
    where, name = spec.split(":")
    d = f"{tmp}/{where.split('/')[0]}/checkpoints/step_{int(where.split('/')[1]):08d}"
    t = next(t for t in json.load(open(f"{d}/manifest.json"))["tensors"]
             if t["kind"] == "own" and t["name"] == name + ".tp0of1.pp0of1")
    out = b""
    for p in t["pieces"]:
        with open(f"{d}/{p['file']}", "rb") as f:
            f.seek(p["offset"])
            out += f.read(p["bytes"])
    return out
for c in checks:
    op, a, *b = c.split(" ")
    x = read(a)
    ok = {"EQ": lambda: all(read(y) == x for y in b), "ZERO": lambda: not any(x),
          "NONZERO": lambda: any(x)}[op]()
    print(f"{'ok' if ok else 'FAILED'}: {c}")
    if not ok: sys.exit(1)
PY
}
says() {  # says RUN TEXT: TEXT is in the run's log
  grep -q -F -- "$2" "$tmp/$1.log" || { echo "$1: no \"$2\" in the log"; cat "$tmp/$1.log"; exit 1; }
}
loss_at() {  # loss_at RUN STEP
  /usr/bin/python3 -c 'import json, sys
print(next(d["loss"] for d in map(json.loads, open(sys.argv[1])) if d.get("step") == int(sys.argv[2]) and "loss" in d))' \
    "$tmp/$1/metrics.jsonl" "$2"
}
d10i8=("${diloco[@]}" --set diloco.inner_steps=10 --set parallel.grad_comm=int8)
run shrink 1 "${d10i8[@]}" --set checkpoint.resume="$tmp/cut/checkpoints/step_00000015" \
  --set train.stop_at=16
says shrink "DiLoCo: the checkpoint's 2 replica(s) go on as 1: replica 0 goes on with its round; replica 1 is dropped from its round"
# as_sync's step 16 ran the anchor's weights on the same 8 rows.
/usr/bin/python3 -c 'import sys; a, b = map(float, sys.argv[1:])
print(f"shrink: loss at step 16 {a:.4f}, the anchor'"'"'s {b:.4f}"); sys.exit(not a < 0.995 * b)' \
  "$(loss_at shrink 16)" "$(loss_at as_sync 16)"
own "EQ shrink/16:diloco.momentum.dp0of1 cut/15:diloco.momentum.dp0of2" \
  "NONZERO shrink/16:diloco.momentum.dp0of1"
# Four streaming replicas in int8 go on as two: replica 1 keeps its residual (step 15 sends no
# fragment), and the fragment in flight since 14 is dropped.
run shrink4 2 "${s4[@]}" --set checkpoint.resume="$tmp/s4cut/checkpoints/step_00000014" \
  --set train.stop_at=15
says shrink4 "the checkpoint's 4 replica(s) go on as 2: replicas 0-1 go on with their rounds; replicas 2-3 are dropped from theirs"
own "EQ shrink4/15:diloco.residual.dp1of2 s4cut/14:diloco.residual.dp1of4" \
  "NONZERO s4cut/14:diloco.residual.dp1of4"
run grow 2 "${d10i8[@]}" --set checkpoint.resume="$tmp/shrink/checkpoints/step_00000016" \
  --set train.stop_at=17
says grow "DiLoCo: the checkpoint's 1 replica(s) go on as 2: replica 0 goes on with its round; replica 1 joins from the anchor"
own "EQ grow/17:diloco.momentum.dp1of2 grow/17:diloco.momentum.dp0of2 shrink/16:diloco.momentum.dp0of1" \
  "ZERO grow/17:diloco.residual.dp1of2"
run grow 2 "${d10i8[@]}" --resume auto
/usr/bin/python3 -c 'import sys; a, b = map(float, sys.argv[1:])
print(f"grow: loss at step 40 {a:.4f}, synchronous {b:.4f} ({100 * (a - b) / b:+.2f}%, limit +2%)")
sys.exit(not a <= 1.02 * b)' "$(loss_at grow 40)" "$(loss_at sync 40)"

refused zero1 2 "parallel.dp_sync" "${diloco[@]}" --set parallel.zero=1
refused stray 2 "diloco.inner_steps" --set diloco.inner_steps=5
refused tp2 2 "parallel.dp_sync" "${diloco[@]}" --set parallel.tp=2
refused fp16 2 "parallel.dp_sync" "${diloco[@]}" --set train.precision=fp16
refused frag 2 "diloco.fragments" "${diloco[@]}" --set diloco.inner_steps=4 --set diloco.fragments=5
refused overlap 2 "diloco.overlap_steps" "${diloco[@]}" --set diloco.inner_steps=4 \
  --set diloco.overlap_steps=4
refused stray_f 2 "diloco.fragments" --set diloco.fragments=2
