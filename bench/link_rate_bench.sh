#!/usr/bin/env bash
# The step on links like a cluster's: the quickstart model (gpt2-mini, 16.1M parameters, bf16,
# batch 16 x 128) trained data-parallel over two network-namespace hosts (one rank of one thread
# each; tests/cluster/netns.sh), with each host's link limited by cluster_link_rate to each RATE
# in turn. Prints per rate the median step, the time the step waited on the gradients' all-reduce
# (dp_wait_ms), the bytes each rank sent, and the step's slowdown against the unlimited link, the
# peer run in the same invocation. Needs root.
#   bench/link_rate_bench.sh [KEEL] [STEPS] [RATES...]      (default: 8 steps; 10gbit 1gbit 200mbit)
set -euo pipefail
keel=$(realpath "${1:-build/keel}")
steps=${2:-8}
shift $(($# > 2 ? 2 : $#))
rates=("$@")
((${#rates[@]})) || rates=(10gbit 1gbit 200mbit)
src=$(cd "$(dirname "$0")/.." && pwd)
shared=$src/../shared/data
# shellcheck source=../tests/cluster/netns.sh
source "$src/tests/cluster/netns.sh"
p=klr
tmp=$(mktemp -d)
trap 'cluster_down "$p" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
cluster_down "$p" >/dev/null 2>&1 || true
cluster_up "$p" 2
cluster_mpi_env "$p"
cluster_hostfile "$p" "$tmp/hosts" 1

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
run() {  # NAME: the quickstart over both hosts, one rank each
  timeout 900 mpirun --hostfile "$tmp/hosts" -np 2 --map-by node -x OMP_NUM_THREADS=1 "$keel" train \
    "$src/configs/quickstart.toml" --set data.train="$shared/brown/brown.gpt2.u16" \
    --set data.val= --set train.val_every=0 --set train.sample_count=0 --set train.steps="$steps" \
    --set train.log_every=1 --set checkpoint.every_minutes=0 --set checkpoint.save_final=false \
    --set train.out_dir="$tmp" --set train.name="$1" >"$tmp/$1.log" 2>&1 ||
    { echo "$1 failed:"; tail "$tmp/$1.log"; exit 1; }
}
stats() {  # NAME -> "median_ms median_dp_wait_ms MB_sent_per_step" over steps 3..
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l][2:]
med = lambda k: statistics.median(r.get(k, 0) for r in rows)
print(f"{med('ms'):.0f} {med('dp_wait_ms'):.0f} {med('comm_bytes') / 1e6:.1f}")
PY
}

run free
read -r base wait sent < <(stats free)
printf '%-10s %7s ms/step, %6s ms waiting on the all-reduce, %s MB sent per rank\n' \
  unlimited "$base" "$wait" "$sent"
for r in "${rates[@]}"; do
  for i in 1 2; do cluster_link_rate "$p" "$i" "$r"; done
  run "rate_$r"
  read -r ms wait sent < <(stats "rate_$r")
  printf '%-10s %7s ms/step, %6s ms waiting on the all-reduce, %s MB sent per rank: %sx unlimited\n' \
    "$r" "$ms" "$wait" "$sent" "$(awk -v a="$ms" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
done
