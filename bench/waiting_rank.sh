#!/usr/bin/env bash
# What waiting on other ranks costs, against another build of keel in the same invocation (the
# peer: BASE, e.g. a build of the commit before a change to parallel/mpi_engine.cc):
#   1. the CPU a rank uses while its peer hangs (KEEL_FAULT hang in backward, dp 2, test-tiny),
#      measured from /proc over 6 s after the hang: a rank that spins uses 1.00 core;
#   2. tokens/s and the communication the step waited for, gpt2-mini bf16 T=256 on 2 ranks
#      (dp 2, dp 2 ZeRO 3, tp 2, pp 2), alternating the two builds REPS times.
#
#   BASE=/tmp/old-build bench/waiting_rank.sh       # REPS=3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
base=${BASE:?set BASE to the build folder to compare against (with keel and bench_train_step)}
reps=${REPS:-3}
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
mpi=(mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1)

# cpu_while_hung BUILD: the CPU (cores) of the waiting rank, 12-18 s into the run.
cpu_while_hung() {
  local out=$tmp/run-$RANDOM
  head -c 400000 "$root/../shared/data/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
  KEEL_FAULT="hang@2:1,phase=backward" timeout 60 "${mpi[@]}" -x KEEL_FAULT "$1/keel" train \
    "$root/configs/test-tiny.toml" --set data.train="$tmp/tokens.u16" --set train.out_dir="$out" \
    --set train.steps=20 --set train.val_every=0 --set parallel.comm_timeout_s=25 \
    >"$out.log" 2>&1 &
  local job=$!
  sleep 12
  local pids tick most=0 p used
  # The ranks only: mpirun and timeout carry the same command line.
  pids=$(pgrep -x keel | xargs)
  [[ -n $pids ]] || { echo "no keel process running: $(tail -3 "$out.log")" >&2; return 1; }
  tick=$(getconf CLK_TCK)
  declare -A a
  for p in $pids; do a[$p]=$(awk '{print $14 + $15}' "/proc/$p/stat"); done
  sleep 6
  for p in $pids; do
    used=$(awk '{print $14 + $15}' "/proc/$p/stat") || continue
    used=$((used - a[$p]))
    ((used > most)) && most=$used
  done
  wait "$job" || true
  echo "scale=2; $most / $tick / 6" | bc
}

step() {  # BUILD ZERO MICRO_BATCHES PP [VIRTUAL LAYERS TP SP]
  "${mpi[@]}" "$1/bench_train_step" gpt2-mini 1 256 bf16 5 1 none "${@:2}" 2>/dev/null | tail -1
}

echo "waiting_rank: $(basename "$base") (base) against $(basename "$build"), $(nproc) cores"
cpu_base=$(cpu_while_hung "$base")
cpu_this=$(cpu_while_hung "$build")
echo "CPU of the waiting rank while its peer hangs (cores): base $cpu_base, this $cpu_this"
for layout in "dp2:0 4 1" "dp2-zero3:3 4 1" "tp2:0 8 1 1 equal 2 0" "pp2:0 8 2"; do
  name=${layout%%:*}
  read -r -a args <<<"${layout#*:}"
  for ((i = 0; i < reps; i++)); do
    step "$base" "${args[@]}" >>"$tmp/$name.base.jsonl"
    step "$build" "${args[@]}" >>"$tmp/$name.this.jsonl"
  done
  /usr/bin/python3 - "$name" "$tmp/$name.base.jsonl" "$tmp/$name.this.jsonl" <<'PY'
import json, statistics, sys
name, a, b = sys.argv[1], *[[json.loads(l) for l in open(p)] for p in sys.argv[2:]]
med = lambda rows, k: statistics.median(r[k] for r in rows)
print(f"{name:10s} tokens/s base {med(a, 'tokens_per_s'):6.0f}  this {med(b, 'tokens_per_s'):6.0f}"
      f"  ratio {med(b, 'tokens_per_s') / med(a, 'tokens_per_s'):.3f}   comm wait ms/step base"
      f" {med(a, 'comm_wait_ms'):6.1f}  this {med(b, 'comm_wait_ms'):6.1f}")
PY
done
