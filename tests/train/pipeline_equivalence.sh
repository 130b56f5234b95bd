#!/usr/bin/env bash
# Pipeline parallelism trains the same model as one process. A 4-layer tiny GPT, 20 steps, global
# batch 8 in micro-batches of 2 (the reference accumulates the same micro-batches):
#   fp32: pp 2, pp 4, pp 2 with full recompute, pp 2 interleaved (2 chunks of 1 layer per rank),
#         pp 2 split 3+1 by parallel.pp_layers=auto,
#         dp 2 x pp 2 with ZeRO 0 and 1: every step's loss
#         within 1e-5 relative of one process, and the final weights within 1e-3 of its, relative
#         to each tensor's largest value (a stage that dropped the tied embedding's other half,
#         or double-counted it in the norm, breaks both), as in layout_ and tensor_equivalence:
#         the tied wte's gradient is summed in another order across the stages, and AdamW's
#         m/√v turns 1e-7 gradient noise on rows whose two halves nearly cancel into 1.7e-4 of
#         the weights after 20 steps on an AVX-512 CPU (oneDNN's kernels there; an AVX2 CPU
#         stayed under 1e-4);
#   bf16: pp 2 within 1e-2 of one bf16 process;
#   checkpoints: saved at pp 2 after 10 steps, resumed at dp 2 and at pp 4; saved at dp 1,
#         resumed at pp 2 x dp 2: steps 11-20 within 1e-6 relative of the uninterrupted run;
#   and the layouts the 1F1B schedule cannot run are refused with one line and exit 2.
#   tests/train/pipeline_equivalence.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_4layer "$shared"

run ref-fp32 1
run ref-bf16 1 --set train.precision=bf16
run pp2 2 --set parallel.pp=2
run pp4 4 --set parallel.pp=4
run pp2-recompute 2 --set parallel.pp=2 --set model.recompute=full
run pp2-v2 2 --set parallel.pp=2 --set parallel.virtual_stages=2
run pp2-auto 2 --set parallel.pp=2 --set parallel.pp_layers=auto
grep -q "pipeline: 2 stages of 3+1 layers" "$tmp/pp2-auto.log" ||
  { echo "pp2-auto: the balanced split is not 3+1"; cat "$tmp/pp2-auto.log"; exit 1; }
run dp2-pp2-z0 4 --set parallel.pp=2 --set parallel.dp=2 --set train.micro_batch_size=1
run dp2-pp2-z1 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1 \
  --set train.micro_batch_size=1
run dp2-pp2-v2 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.virtual_stages=2 \
  --set train.micro_batch_size=1
run bf16-pp2 2 --set parallel.pp=2 --set train.precision=bf16
grep -q "pipeline: 2 stages of 2+2 layers, 1F1B over 4 micro-batches" "$tmp/pp2.log" ||
  { echo "pp2: no pipeline line in the log"; cat "$tmp/pp2.log"; exit 1; }
grep -q "pipeline: 2 stages x 2 interleaved chunks of 1 layer(s)" "$tmp/pp2-v2.log" ||
  { echo "pp2-v2: no interleaved pipeline line in the log"; cat "$tmp/pp2-v2.log"; exit 1; }

# Checkpoints across pipeline layouts (the manifest stores whole tensors; a stage is a box).
run full-pp2 2 --set parallel.pp=2 --set checkpoint.every_steps=10
run cut-pp2 2 --set parallel.pp=2 --set train.stop_at=10
cp -r "$tmp/cut-pp2" "$tmp/pp2to-dp2" && run pp2to-dp2 2 --resume auto
cp -r "$tmp/cut-pp2" "$tmp/pp2to-pp4" && run pp2to-pp4 4 --set parallel.pp=4 --resume auto
run cut-dp1 1 --set train.stop_at=10
cp -r "$tmp/cut-dp1" "$tmp/dp1to-pp2dp2" &&
  run dp1to-pp2dp2 4 --set parallel.pp=2 --set parallel.dp=2 --set train.micro_batch_size=1 \
    --resume auto
run cut-dp2pp2z1 4 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1 \
  --set train.micro_batch_size=1 --set train.stop_at=10
cp -r "$tmp/cut-dp2pp2z1" "$tmp/dp2pp2z1to-dp1" && run dp2pp2z1to-dp1 1 --resume auto
for r in pp2to-dp2 pp2to-pp4 dp1to-pp2dp2 dp2pp2z1to-dp1; do
  grep -q "resuming from .*step_00000010" "$tmp/$r.log" ||
    { echo "$r did not resume from step 10"; cat "$tmp/$r.log"; exit 1; }
done

refused bad-zero2 2 "pipeline stages take ZeRO 0 or 1" --set parallel.pp=2 --set parallel.zero=2
refused bad-micro 4 "needs at least 4 micro-batches" --set parallel.pp=4 --set train.micro_batch_size=4
refused bad-layers 2 "n_layer" --set parallel.pp=2 --set model.n_layer=3
refused bad-chunks 2 "pp=2 x virtual_stages=4 = 8 does not divide model.n_layer=4" \
  --set parallel.pp=2 --set parallel.virtual_stages=4
refused bad-split 2 '"2,1" gives 2 stage(s) of 3 layers in all' --set parallel.pp=2 \
  --set parallel.pp_layers=2,1
refused bad-split-text 2 'expected "auto" or blocks per stage' --set parallel.pp=2 \
  --set parallel.pp_layers=3,x
refused bad-interleave 2 "a multiple of pp=2" --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set train.batch_size=6

KEEL_TEST_DIR="$src/tests/train" /usr/bin/python3 - "$tmp" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["KEEL_TEST_DIR"])
import run_outputs as ro
d = sys.argv[1]
bad = 0
def check(name, ref, limit, wlimit=None, first=0):
    global bad
    bad |= not ro.check(d, name, ref, limit, wlimit, first)
for name in ["pp2", "pp4", "pp2-recompute", "pp2-v2", "pp2-auto", "dp2-pp2-z0", "dp2-pp2-z1",
             "dp2-pp2-v2"]:
    check(name, "ref-fp32", 1e-5, 1e-3)
check("bf16-pp2", "ref-bf16", 1e-2)
for name, ref in [("pp2to-dp2", "full-pp2"), ("pp2to-pp4", "full-pp2"), ("dp1to-pp2dp2", "ref-fp32"),
                  ("dp2pp2z1to-dp1", "dp2-pp2-z1")]:
    check(name, ref, 1e-6, first=10)
bubbles = [json.loads(l) for l in open(f"{d}/pp4/metrics.jsonl")]
b = bubbles[-1]
print(f"pp4: measured bubble {b['bubble']:.3f}, predicted {b['bubble_predicted']:.3f}")
if not (0 <= b["bubble"] < 1 and abs(b["bubble_predicted"] - 3 / 7) < 1e-9):
    print("pp4: bubble figures out of range"); bad = 1
# The trainer's memory report names every stage: stage 0's total is rank 0's own.
mem = next(json.loads(l) for l in open(f"{d}/pp2/events.jsonl") if '"memory"' in l)
per = mem.get("stage_bytes", [])
print(f"pp2: memory per stage {[round(b / 2**20, 2) for b in per]} MiB")
if len(per) != 2 or per[0] != sum(mem["bytes"].values()) or min(per) <= 0:
    print(f"pp2: memory event {mem}"); bad = 1
m = json.load(open(f"{d}/cut-pp2/checkpoints/step_00000010/manifest.json"))
if m["state"]["layout"] != {"dp": 1, "tp": 1, "pp": 2, "zero": 0}:
    print(f"cut-pp2: manifest layout {m['state']['layout']}"); bad = 1
names = {t["name"] for t in m["tensors"]}
if not {"wte.weight", "h.0.ln_1.weight", "h.3.mlp.c_proj.weight", "ln_f.bias"} <= names:
    print("cut-pp2: the manifest misses tensors"); bad = 1
sys.exit(bad)
PY
