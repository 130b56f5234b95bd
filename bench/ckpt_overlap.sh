#!/usr/bin/env bash
# What an asynchronous checkpoint costs the steps around it, beside the blocking save, in one
# invocation: GPT-2 124M bf16 (B=4, T=256, one rank on every core) saves every 3 steps while
# training goes on, and at the end synchronously. For each async save: its wall time, the steps
# that ran beside it and how much longer they took than the steps without a save (the trainer's
# own figure, `steps_lost_ms` in events.jsonl), as a share of the save's time; the final save's
# blocked time is what the same save costs when nothing overlaps it. Run four times: the writer
# at normal and at the lowest priority ([checkpoint] writer_nice 0, 19), through the page cache
# and with O_DIRECT ([checkpoint] direct_io).
#   bench/ckpt_overlap.sh [OUT_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/ckpt_overlap}
steps=${2:-13}
keel=build/keel
rm -rf "$out"
mkdir -p "$out"
head -c 4000000 ../shared/data/brown/brown.gpt2.u16 >"$out/tokens.u16"
for variant in "0 false" "19 false" "0 true" "19 true"; do
  read -r nice direct <<<"$variant"
  name=nice${nice}_direct_$direct
  "$keel" train configs/quickstart.toml --set model.name=gpt2 \
    --set data.train="$out/tokens.u16" --set data.val="" --set data.seq_len=256 \
    --set train.batch_size=4 --set train.precision=bf16 --set train.steps="$steps" \
    --set train.out_dir="$out" --set train.name=$name --set train.sample_count=0 \
    --set checkpoint.every_steps=3 --set checkpoint.every_minutes=0 \
    --set checkpoint.save_final=false --set checkpoint.writer_nice=$nice --set checkpoint.direct_io=$direct >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  /usr/bin/python3 - "$out/$name" "$nice" "$direct" <<'PY'
import json, sys
run, nice, direct = sys.argv[1], sys.argv[2], sys.argv[3]
ev = [json.loads(l) for l in open(f"{run}/events.jsonl")]
saves = [e for e in ev if e["event"] == "checkpoint"]
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
clean = sorted(m["ms"] for m in steps if "save_overlap_ms" not in m and m["step"] > 1)
print(f"writer nice {nice}, direct_io {direct}: median step without a save {clean[len(clean) // 2]:.0f} ms")
lost = total = 0
for e in saves[:-1]:
    print(f"  async save of step {e['step']}: {e['total_ms']:.0f} ms, {e['overlapped_steps']} "
          f"step(s) beside it lost {e['steps_lost_ms']:.0f} ms = "
          f"{100 * e['steps_lost_ms'] / e['total_ms']:.0f}% of the save; blocked {e['blocked_ms']:.0f} ms")
    print(f"    the writer: snapshot {e['snapshot_ms']:.0f} ms, write+fsync {e['write_ms']:.0f} ms "
          f"(fsync {e['fsync_ms']:.0f}); CPU {e['writer_user_ms']:.0f} ms user (copy, xxh3), "
          f"{e['writer_sys_ms']:.0f} ms kernel (page cache)")
    lost += e["steps_lost_ms"] + e["blocked_ms"]
    total += e["total_ms"]
last = saves[-1]
print(f"  blocking save at the end (step {last['step']}): {last['blocked_ms']:.0f} ms")
print(f"  async saves: {lost:.0f} ms lost of {total:.0f} ms saving = {100 * lost / total:.0f}%; "
      f"per save {lost / max(1, len(saves) - 1):.0f} ms vs {last['blocked_ms']:.0f} ms blocking")
PY
done
