#!/usr/bin/env bash
# ZeRO 3 with the weights' shard on the offload tier ([offload] params): GPT-2 124M in bf16 at 2
# ranks (one thread each), ZeRO 3, a few steps, three runs side by side:
#   1. everything in memory (the peer);
#   2. [offload] dir: the master and moments on the tier;
#   3. [offload] dir and params: the weights' shard on the tier as well, read before each
#      segment's gather in the forward and the backward.
# Prints each run's memory per rank (as keel train reports its allocations), its median step
# time and the ratio to run 1, and the tier's traffic; the weights of runs 2 and 3 must equal
# run 1's bitwise.
#   bench/offload_params_bench.sh [KEEL] [STEPS] [TIER_DIR]
set -euo pipefail
keel=${1:-build/keel}
steps=${2:-8}
tier=${3:-/var/tmp/keel-offload-params-bench}
src=$(cd "$(dirname "$0")/.." && pwd)
shared=$src/../shared/data
tmp=$(mktemp -d /var/tmp/keel-offload-params-run.XXXXXX)
trap 'rm -rf "$tmp" "$tier"' EXIT
mkdir -p "$tier"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
args=(train "$src/configs/quickstart.toml" --set model.name=gpt2 --set data.seq_len=256
      --set data.train="$shared/brown/brown.gpt2.u16" --set data.val= --set train.val_every=0
      --set train.steps="$steps" --set train.batch_size=4 --set train.sample_count=0
      --set train.log_every=1 --set checkpoint.every_minutes=0 --set parallel.zero=3
      --set train.out_dir="$tmp")

run() {  # run NAME EXTRA...
  local name=$1
  shift
  mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "$keel" "${args[@]}" \
    --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 ||
    { echo "$name failed:"; tail "$tmp/$name.log"; exit 1; }
}

median_ms() {  # steps 3.. (the first ones warm caches and read the tier's first chunks)
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1]) if '"ms"' in l][2:]
print(f"{statistics.median(ms):.0f}")
PY
}

run mem
run tier --set offload.dir="$tier"
run params --set offload.dir="$tier" --set offload.params=true
base=$(median_ms mem)
for name in mem tier params; do
  ms=$(median_ms "$name")
  total=$(grep -m1 -o "total [0-9.]* MiB" "$tmp/$name.log" | head -1)
  on_tier=$(grep -m1 -o "on the offload tier: [0-9.]* MiB" "$tmp/$name.log" || true)
  printf '%-7s memory per rank: %-16s %-32s %6s ms/step = %s x in memory\n' "$name" \
    "${total#total }" "${on_tier:+(${on_tier#on the })}" "$ms" \
    "$(awk -v a="$ms" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
done
grep -h "keel: offload tier:" "$tmp/tier.log" "$tmp/params.log" | sed 's/^/  /'
for name in tier params; do
  cmp -s "$tmp/mem/model.safetensors" "$tmp/$name/model.safetensors" ||
    { echo "$name: the weights differ from the in-memory run's"; exit 1; }
done
echo "weights: bitwise the in-memory run's (tier, params)"
