#!/usr/bin/env bash
# Checkpoint speed against the disk, in one invocation: for GPT-2 124M and 350M (fp32 master
# weights and both AdamW moments, 12 bytes per parameter), `keel train` saves at step 2 (async,
# while step 3 computes) and at step 4 (the end, synchronous); the same number of bytes is then
# written by dd with an fsync, on the same folder. Printed: save throughput and its ratio to dd,
# the time the step was blocked per save, and the load (read + verify) time of a resume.
#   bench/ckpt_throughput.sh [OUT_DIR]     (OUT_DIR on the disk to measure; default build/ckpt_bench)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/ckpt_bench}
keel=build/keel
rm -rf "$out"
mkdir -p "$out"
head -c 2000000 ../shared/data/brown/brown.gpt2.u16 >"$out/tokens.u16"

printf '%-12s %9s %10s %10s %8s %12s %12s %10s\n' model "state" "keel MB/s" "dd MB/s" ratio \
  "blocked ms" "step ms" "load ms"
for model in gpt2 gpt2-medium; do
  run="$out/$model"
  args=(--set model.name=$model --set data.train="$out/tokens.u16" --set data.seq_len=64
        --set train.batch_size=1 --set train.out_dir="$out" --set train.name=$model
        --set train.sample_count=0 --set train.log_every=1 --set checkpoint.every_steps=2
        --set checkpoint.every_minutes=0 --set checkpoint.save_final=false)
  "$keel" train "${args[@]}" --set train.steps=4 >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
  "$keel" train "${args[@]}" --set train.steps=5 --resume auto >"$run.resume.log" 2>&1 ||
    { cat "$run.resume.log"; exit 1; }
  bytes=$(/usr/bin/python3 -c "
import json
for l in open('$run/events.jsonl'):
    e = json.loads(l)
    if e['event'] == 'checkpoint': print(e['bytes']); break")
  sync
  dd_log=$(dd if=/dev/zero of="$out/dd.bin" bs=64M count=$(((bytes + 67108863) / 67108864)) \
    conv=fsync 2>&1 | tail -1)
  rm -f "$out/dd.bin"
  /usr/bin/python3 - "$run" "$model" "$dd_log" "$run.resume.log" <<'PY'
import json, re, sys
run, model, dd_log, resume_log = sys.argv[1:]
saves = [json.loads(l) for l in open(f"{run}/events.jsonl") if '"checkpoint"' in l]
saves = [e for e in saves if e["event"] == "checkpoint"]
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
m = re.search(r"([\d.]+) s, ([\d.]+) ([GMk]?B)/s", dd_log)
secs = float(m.group(1))
dd_bytes = float(re.match(r"(\d+) bytes", dd_log).group(1))
dd_mbs = dd_bytes / secs / 1e6
# Save throughput: bytes over the writer's write+fsync time (the copy to staging is separate).
keel_mbs = max(e["bytes"] / (e["write_ms"] / 1e3) / 1e6 for e in saves)
blocked = saves[0]["blocked_ms"]  # the async save at step 2, as step 3 saw it
step_ms = sorted(s["ms"] for s in steps)[len(steps) // 2]
load = re.search(r"in (\d+) ms", open(resume_log).read())
print(f"{model:<12} {saves[0]['bytes'] / 2**30:7.2f}GB {keel_mbs:10.0f} {dd_mbs:10.0f} "
      f"{keel_mbs / dd_mbs:7.2f}x {blocked:12.1f} {step_ms:12.1f} {load.group(1) if load else '?':>10}")
for e in saves:
    print(f"    save of step {e['step']}: snapshot {e['snapshot_ms']:.0f} ms, write+fsync "
          f"{e['write_ms']:.0f} ms, total {e['total_ms']:.0f} ms, step blocked {e['blocked_ms']:.1f} ms")
PY
  rm -rf "$run"
done
