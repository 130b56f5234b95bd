#!/usr/bin/env bash
# The offload tier under a memory limit: GPT-2 124M (bf16, 18 bytes per parameter of state in
# memory) trained for a few steps
#   1. in memory, in a memory cgroup without a limit: its peak usage P and its step time;
#   2. in memory again under memory limit P/2: expected to be killed (the limit is real);
#   3. with [offload] dir under the same limit P/2: it must complete; its peak, its step time
#      against run 1's (the issue's target: at most 1.3x), and the tier's traffic and bandwidth.
# Also the disk's own O_DIRECT bandwidth (dd) beside it, the peer for the tier's figure.
# Needs root and cgroup v1's memory controller (/sys/fs/cgroup/memory) or cgroup v2.
#   bench/offload_bench.sh [KEEL] [STEPS] [TIER_DIR]
set -euo pipefail
keel=${1:-build/keel}
steps=${2:-8}
tier=${3:-/var/tmp/keel-offload-bench}
src=$(cd "$(dirname "$0")/.." && pwd)
shared=$src/../shared/data
tmp=$(mktemp -d /var/tmp/keel-offload-bench-run.XXXXXX)
if [[ -d /sys/fs/cgroup/memory ]]; then
  cg=/sys/fs/cgroup/memory/keel_offload_bench limit_file=memory.limit_in_bytes
  peak_file=memory.max_usage_in_bytes unlimited=-1
else
  cg=/sys/fs/cgroup/keel_offload_bench limit_file=memory.max peak_file=memory.peak unlimited=max
fi
cleanup() { rmdir "$cg" 2>/dev/null || true; rm -rf "$tmp" "$tier"; }
trap cleanup EXIT
mkdir -p "$tier"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
dd if=/dev/zero of="$tier/dd" bs=16M count=64 oflag=direct 2>&1 | tail -1 | sed 's/^/dd write (O_DIRECT): /'
dd if="$tier/dd" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | sed 's/^/dd read (O_DIRECT):  /'
rm -f "$tier/dd"

args=(train "$src/configs/quickstart.toml" --set model.name=gpt2 --set data.seq_len=512
      --set data.train="$shared/brown/brown.gpt2.u16" --set data.val= --set train.val_every=0
      --set train.steps="$steps" --set train.batch_size=8 --set train.micro_batch_size=2
      --set train.sample_count=0 --set train.log_every=1 --set checkpoint.every_minutes=0
      --set checkpoint.save_final=false --set train.out_dir="$tmp")

# run NAME LIMIT_BYTES EXTRA...: keel in a fresh cgroup; prints "rc peak_bytes"
run() {
  local name=$1 limit=$2
  shift 2
  rmdir "$cg" 2>/dev/null || true
  mkdir "$cg"
  echo "$limit" >"$cg/$limit_file"
  local rc=0
  bash -c "echo \$\$ > '$cg/cgroup.procs'; exec '$keel' \"\$@\"" _ "${args[@]}" \
    --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 || rc=$?
  echo "$rc $(cat "$cg/$peak_file")"
}

# The median step time of steps 3.. (the first ones warm caches and read the tier's first chunks).
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }  # no bc on a bare Debian

median_ms() {
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1]) if '"ms"' in l][2:]
print(f"{statistics.median(ms):.0f}")
PY
}

read -r rc peak < <(run mem "$unlimited")
[[ $rc == 0 ]] || { echo "the in-memory run failed (exit $rc):"; tail "$tmp/mem.log"; exit 1; }
mem_ms=$(median_ms mem)
half=$((peak / 2))
printf 'in memory:            peak %7.0f MiB, %s ms/step\n' "$(div "$peak" 1048576)" "$mem_ms"
read -r rc2 peak2 < <(run mem_limited "$half")
printf 'in memory, limit %4.0f MiB: exit %s (%s)\n' "$(div "$half" 1048576)" "$rc2" \
  "$([[ $rc2 == 0 ]] && echo "completed: the limit did not bite" || echo "killed, as expected")"
read -r rc3 peak3 < <(run offload "$half" --set offload.dir="$tier")
[[ $rc3 == 0 ]] || { echo "the offloaded run failed under the limit (exit $rc3):"; tail "$tmp/offload.log"; exit 1; }
off_ms=$(median_ms offload)
printf 'offloaded, limit %4.0f MiB: completed, peak %7.0f MiB, %s ms/step = %.2fx in memory\n' \
  "$(div "$half" 1048576)" "$(div "$peak3" 1048576)" "$off_ms" \
  "$(div "$off_ms" "$mem_ms")"
grep -h -m1 "memory per rank" "$tmp/mem.log" "$tmp/offload.log" | sed 's/^/  /'
grep -h "keel: offload tier:" "$tmp/offload.log" | sed 's/^/  /'
