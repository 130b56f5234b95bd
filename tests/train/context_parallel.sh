#!/usr/bin/env bash
# Context parallelism (parallel.cp) against one process at the same tokens: 136-token sequences
# (chunks of 34 at cp 2 and of 17 at cp 4, so that chunks end inside the kernel's 64-row tiles),
# 20 steps of the tiny GPT, batch 8 in micro-batches of 2:
#   the ring at cp 2, cp 4, cp 2 x tp 2 (+ sp), cp 2 x dp 2 at ZeRO 3, cp 2 x pp 2, with recompute
#   "attn", the all-gather at cp 2 and 4 and with recompute "full", a Llama with grouped-query attention at cp 2 both ways: every step's loss
#   within 1e-5 relative (fp32), the final weights within 1e-3; bf16 at cp 2 within 1e-2 of one
#   bf16 process;
#   loss-masked chat data packed with document masking (documents beginning in other ranks'
#   chunks) at cp 2 (ring) and cp 4 (all-gather) within 1e-5 of one process;
#   a cp 2 run's checkpoint resumed at cp 1 and at cp 4 (ZeRO 1: the optimizer state resharded)
#   continues the reference's curve within 1e-5;
#   the keys' and values' exchange shows in metrics.jsonl (cp_wait_ms) and nowhere without cp;
#   layouts it cannot take are one line and exit 2.
#   tests/train/context_parallel.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_4layer "$shared"  # validation every 10 steps: the forward-only path splits too
common+=(--set model.n_layer=2 --set data.seq_len=136 --set model.block_size=256)

llama=(--set model.name=llama-tiny)
run ref 1
run cp2 2 --set parallel.cp=2
run cp4 4 --set parallel.cp=4
run cp2ag 2 --set parallel.cp=2 --set parallel.cp_comm=allgather
run cp4ag 4 --set parallel.cp=4 --set parallel.cp_comm=allgather
run cp2tp2 4 --set parallel.cp=2 --set parallel.tp=2
run cp2tp2sp 4 --set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true
run cp2dp2z3 4 --set parallel.cp=2 --set parallel.zero=3
run cp2pp2 4 --set parallel.cp=2 --set parallel.pp=2
run cp2attn 2 --set parallel.cp=2 --set model.recompute=attn
run cp2full 2 --set parallel.cp=2 --set model.recompute=full --set parallel.cp_comm=allgather
run llama-ref 1 "${llama[@]}"
run llama-cp2 2 "${llama[@]}" --set parallel.cp=2
run llama-cp2ag 2 "${llama[@]}" --set parallel.cp=2 --set parallel.cp_comm=allgather
run bf16-ref 1 --set train.precision=bf16
run bf16-cp2 2 --set train.precision=bf16 --set parallel.cp=2
# Resharding: a cp 2 run at ZeRO 1 stops at step 10; cp 1 and cp 4 take its checkpoint on.
run ckpt 2 --set parallel.cp=2 --set parallel.zero=1 --set train.stop_at=10 \
  --set checkpoint.every_steps=10
for to in 1 4; do
  cp -r "$tmp/ckpt" "$tmp/resume$to"
  run "resume$to" "$to" --set parallel.cp="$to" --set parallel.zero=1 --resume auto
done

# Loss-masked chat data, packed (document masking): documents begin in other ranks' chunks.
"$keel" data prepare "$src/examples/chat/arithmetic.jsonl" --format chat --out "$tmp/chat" \
  >"$tmp/prepare.log"
chat=(--set data.train="$tmp/chat/train" --set data.seq_len=64 --set model.n_layer=2)
run chat-ref 1 "${chat[@]}"
run chat-cp2 2 "${chat[@]}" --set parallel.cp=2
run chat-cp4ag 4 "${chat[@]}" --set parallel.cp=4 --set parallel.cp_comm=allgather

refused bad-seq 2 "not divisible by 4" --set parallel.cp=2 --set data.seq_len=130
refused bad-ranks 4 "does not match the 4 ranks" --set parallel.cp=3
refused bad-comm 2 "expected one of" --set parallel.cp=2 --set parallel.cp_comm=ulysses
refused bad-diloco 2 "not for DiLoCo" --set parallel.cp=2 --set parallel.dp_sync=diloco \
  --set parallel.dp=1

KEEL_TEST_DIR="$src/tests/train" /usr/bin/python3 - "$tmp" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["KEEL_TEST_DIR"])
import run_outputs as ro
d = sys.argv[1]
ok = True
for name in ["cp2", "cp4", "cp2ag", "cp4ag", "cp2tp2", "cp2tp2sp", "cp2dp2z3", "cp2pp2", "cp2attn",
             "cp2full"]:
    ok = ro.check(d, name, "ref", 1e-5, 1e-3) and ok
for name in ["llama-cp2", "llama-cp2ag"]:
    ok = ro.check(d, name, "llama-ref", 1e-5, 1e-3) and ok
ok = ro.check(d, "bf16-cp2", "bf16-ref", 1e-2) and ok
for name in ["chat-cp2", "chat-cp4ag"]:
    ok = ro.check(d, name, "chat-ref", 1e-5, 1e-3) and ok
for to in (1, 4):
    ok = ro.check(d, f"resume{to}", "ref", 1e-5, 1e-3, first=10) and ok
layout = json.load(open(f"{d}/ckpt/checkpoints/step_00000010/manifest.json"))["state"]["layout"]
print(f"ckpt: manifest layout {layout}")
ok = ok and layout == {"dp": 1, "tp": 1, "pp": 1, "zero": 1, "cp": 2}
for name, want in [("cp2", True), ("cp4ag", True), ("ref", False)]:
    waits = [w for w in ro.metric(d, name, "cp_wait_ms") if w is not None]
    has = len(waits) == 20 and all(w > 0 for w in waits)
    none = all(w == 0 for w in waits)
    print(f"{name}: cp_wait_ms {min(waits):.3g}..{max(waits):.3g} ms per step" if waits
          else f"{name}: no cp_wait_ms")
    ok = ok and (has if want else none)
sys.exit(0 if ok else 1)
PY
