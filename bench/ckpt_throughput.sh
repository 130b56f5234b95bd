#!/usr/bin/env bash
# Checkpoint speed against the disk, in one invocation: for GPT-2 124M and 350M (fp32 master
# weights and both AdamW moments, 12 bytes per parameter), `keel train` saves at steps 4 and 8
# (async, while the next steps compute; 4 steps apart so that a save ends before the next) and 12
# (the end, synchronous); dd writes the same number of random bytes with an fsync to the same
# folder, before and after. Printed: save throughput and its ratio to dd,
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
        --set train.sample_count=0 --set train.log_every=1 --set checkpoint.every_steps=4
        --set checkpoint.every_minutes=0 --set checkpoint.save_final=false)
  # dd before and after keel, same size (12 bytes per parameter), so a disk that drifts during
  # the run shows up as two different dd figures rather than as a keel effect.
  params=$("$keel" plan --model $model --accelerator this-cpu --json 2>/dev/null |
    /usr/bin/python3 -c "import json,sys; print(int(json.load(sys.stdin)['model']['params']))" 2>/dev/null || echo 0)
  dd_bytes=$((params > 0 ? params * 12 : 1500000000))
  # Random bytes, read from the page cache: zeros can be cheaper to store on a thin-provisioned
  # virtual disk, and keel's bytes are not zeros.
  head -c "$dd_bytes" /dev/urandom >"$out/random.bin"
  cat "$out/random.bin" >/dev/null
  dd_run() {
    sync
    dd if="$out/random.bin" of="$out/dd.bin" bs=64M conv=fsync 2>&1 | tail -1
    rm -f "$out/dd.bin"
  }
  dd_before=$(dd_run)
  "$keel" train "${args[@]}" --set train.steps=12 >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
  "$keel" train "${args[@]}" --set train.steps=13 --resume auto >"$run.resume.log" 2>&1 ||
    { cat "$run.resume.log"; exit 1; }
  dd_after=$(dd_run)
  /usr/bin/python3 - "$run" "$model" "$dd_before" "$dd_after" "$run.resume.log" <<'PY'
import json, re, sys
run, model, dd_before, dd_after, resume_log = sys.argv[1:]
saves = [json.loads(l) for l in open(f"{run}/events.jsonl") if '"checkpoint"' in l]
saves = [e for e in saves if e["event"] == "checkpoint"]
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
def dd_rate(line):
    secs = float(re.search(r"([\d.]+) s, ", line).group(1))
    return float(re.match(r"(\d+) bytes", line).group(1)) / secs / 1e6
dd_rates = [dd_rate(dd_before), dd_rate(dd_after)]
dd_mbs = sum(dd_rates) / 2
# Save throughput: bytes over the writer's write+fsync time (the copy to staging is separate),
# the median of the three saves (the disk of a shared VM varies from one write to the next).
rates = sorted(e["bytes"] / (e["write_ms"] / 1e3) / 1e6 for e in saves)
keel_mbs = rates[len(rates) // 2]
# The async save at step 8, as step 9 saw it: the first one (step 4) may still wait for the
# staging buffer's first touch; the one at the end is synchronous (nothing left to overlap).
blocked = saves[1]["blocked_ms"]
step_ms = sorted(s["ms"] for s in steps)[len(steps) // 2]
load = re.search(r"in (\d+) ms", open(resume_log).read())
print(f"{model:<12} {saves[0]['bytes'] / 2**30:7.2f}GB {keel_mbs:10.0f} {dd_mbs:10.0f} "
      f"{keel_mbs / dd_mbs:7.2f}x {blocked:12.1f} {step_ms:12.1f} {load.group(1) if load else '?':>10}")
print(f"    dd before {dd_rates[0]:.0f} MB/s, after {dd_rates[1]:.0f} MB/s")
for e in saves:
    print(f"    save of step {e['step']}: snapshot {e['snapshot_ms']:.0f} ms, write+fsync "
          f"{e['write_ms']:.0f} ms, total {e['total_ms']:.0f} ms, step blocked {e['blocked_ms']:.1f} ms")
PY
  rm -rf "$run" "$out/random.bin"
done
