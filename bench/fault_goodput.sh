#!/usr/bin/env bash
# Goodput of a supervised run with one injected fault of each kind (docs/RESILIENCE.md): GPT-2
# 124M (bf16, B=4 T=256) as 2 local ranks of 1 thread under keel launch for DURATION_S, with
# checkpoints every CKPT_MINUTES and, by step: a killed rank, a hang in backward, NaN gradients,
# a corrupted batch (loss spike: rollback), a flipped bit (replica check: exit 75, restart) and a
# rank slowed 1.5x (named a straggler). SIGTERM at the end (the job saves and stops). Prints what
# caught each fault, when, and the goodput breakdown from RUN/goodput.json.
#
#   bench/fault_goodput.sh                      # 30 minutes
#   MODEL=gpt2-mini DURATION_S=150 STEPS="10 40 70 100 130 160" bench/fault_goodput.sh  # a try
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keel=${KEEL:-$root/build/keel}
shared=${SHARED:-$root/../shared/data}
duration=${DURATION_S:-1800} ckpt_min=${CKPT_MINUTES:-0.5}
read -r s_kill s_hang s_nan s_spike s_flip s_slow <<<"${STEPS:-20 50 80 110 140 170}"
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cp "$shared/brown/brown.gpt2.u16" "$tmp/tokens.u16"
export OMP_NUM_THREADS=1
export KEEL_FAULT="kill@$s_kill:1; hang@$s_hang:1,phase=backward; nan_grad@$s_nan:0; \
spike@$s_spike; bitflip@$s_flip:1,param=h.5.mlp.c_fc.weight,index=7; slow@$s_slow:1,factor=1.5"
"$keel" launch "$root/configs/quickstart.toml" --np 2 --set model.name="${MODEL:-gpt2}" \
  --set data.train="$tmp/tokens.u16" --set data.val="" --set data.seq_len=256 \
  --set train.batch_size=4 --set train.steps=1000000 --set train.val_every=0 \
  --set train.out_dir="$tmp" --set train.name=run --set train.log_every=10 \
  --set checkpoint.every_minutes="$ckpt_min" --set checkpoint.keep_last=2 \
  --set checkpoint.save_final=false --set resilience.hang_timeout_s=30 \
  --set resilience.sdc_every=10 --set resilience.straggler_every=5 \
  --set launch.backoff_s=1 --set launch.heartbeat_s=2 --set launch.heartbeat_timeout_s=60 \
  --set launch.launcher_args=--oversubscribe >"$tmp/launch.log" 2>&1 &
sup=$!
sleep "$duration"
kill -TERM "$sup"
wait "$sup" || true
echo "KEEL_FAULT=\"$KEEL_FAULT\""
grep -E "injected fault|skipped on every|rolled back|silent data|straggler:|hang:" "$tmp/launch.log" |
  sed 's/^/  /' | cut -c1-220
tail -n 2 "$tmp/launch.log"
/usr/bin/python3 - "$tmp/run" <<'PY'
import glob, json, os, sys
run = sys.argv[1]
g = json.load(open(run + "/goodput.json"))
ev = [json.loads(l) for l in open(run + "/events.jsonl")]
fired = {open(m).read().split()[0]: os.path.getmtime(m) for m in glob.glob(run + "/faults/*")}
fails = [e for e in ev if e.get("event") == "failure" and "attempt" in e]
print("| fault | caught by | noticed after (s) |")
print("| --- | --- | ---: |")
for kind, caught in (("kill", "supervisor"), ("hang", "watchdog"), ("bitflip", "replica check")):
    if kind in fired:
        later = [f["time"] - fired[kind] for f in fails if f["time"] >= fired[kind]]
        print(f"| {kind} | {caught}, restart | {min(later):.1f} |" if later else f"| {kind} | not caught | |")
for kind, event in (("nan_grad", "nonfinite_skip"), ("spike", "rollback"), ("slow", "straggler")):
    if kind in fired or kind == "slow":  # a slow rank lasts: it leaves no fired marker
        seen = [e for e in ev if e.get("event") == event]
        print(f"| {kind} | {event} at step {seen[0].get('step', seen[0].get('spike_step'))} | within the run |"
              if seen else f"| {kind} | not caught | |")
ms = sorted(json.loads(l)["ms"] for l in open(run + "/metrics.jsonl"))
print(f"step time: median {ms[len(ms)//2]/1e3:.2f} s over {len(ms)} steps")
print(f"goodput {100*g['goodput']:.1f}% of {g['wall_s']:.0f} s wall, {g['restarts']} restarts: "
      f"useful {g['useful_s']:.0f} s, recomputed {g['recompute_s']:.0f} s, noticing {g['detect_s']:.0f} s, "
      f"restarting {g['restart_s']:.0f} s, startup {g['startup_s']:.0f} s, other {g['other_s']:.0f} s")
PY
