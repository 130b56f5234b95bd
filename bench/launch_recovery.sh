#!/usr/bin/env bash
# What a failure costs under keel launch: GPT-2 124M (bf16, B=4 T=256) on this machine as 2
# local ranks of 1 thread, checkpointing every CKPT_MINUTES; rank 1 is SIGKILLed every KILL_EVERY_S
# seconds, and at DURATION_S the supervisor gets SIGTERM (the job saves and stops). Prints, per
# kill, the time from the rank's death to training again, broken down (noticing it, restarting:
# cleanup + health check + backoff, starting up: processes, MPI, checkpoint load), the health
# check's time, and the run's goodput from RUN/goodput.json. PEER_EVERY=N adds tier-0 copies
# every N steps ([checkpoint] peer_every: the host's holder keeps them in memory): each restart
# then says which tier it loaded and how long the load took.
#
#   bench/launch_recovery.sh                                   # 20 minutes, a kill every 4
#   DURATION_S=300 KILL_EVERY_S=120 bench/launch_recovery.sh   # shorter
#   PEER_EVERY=1 CKPT_MINUTES=5 bench/launch_recovery.sh       # tier 0 every step
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keel=${KEEL:-$root/build/keel}
shared=${SHARED:-$root/../shared/data}
duration=${DURATION_S:-1200} every=${KILL_EVERY_S:-240} ckpt_min=${CKPT_MINUTES:-0.5}
peer_every=${PEER_EVERY:-0}
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cp "$shared/brown/brown.gpt2.u16" "$tmp/tokens.u16"
export OMP_NUM_THREADS=1
"$keel" launch "$root/configs/quickstart.toml" --np 2 --set model.name=gpt2 \
  --set data.train="$tmp/tokens.u16" --set data.val="" --set data.seq_len=256 \
  --set train.batch_size=4 --set train.steps=1000000 --set train.val_every=0 \
  --set train.out_dir="$tmp" --set train.name=run --set train.log_every=10 \
  --set checkpoint.every_minutes="$ckpt_min" --set checkpoint.keep_last=2 \
  --set checkpoint.peer_every="$peer_every" \
  --set checkpoint.save_final=false --set launch.backoff_s=1 --set launch.heartbeat_s=2 \
  --set launch.heartbeat_timeout_s=60 --set launch.launcher_args=--oversubscribe \
  >"$tmp/launch.log" 2>&1 &
sup=$!
start=$(date +%s.%N)
kills=()
while :; do
  now=$(date +%s.%N)
  elapsed=$(/usr/bin/python3 -c "print($now - $start)")
  if /usr/bin/python3 -c "import sys; sys.exit(0 if $elapsed >= $duration else 1)"; then break; fi
  next=$(( ${#kills[@]} + 1 ))
  if /usr/bin/python3 -c "import sys; sys.exit(0 if $elapsed >= $next * $every else 1)"; then
    f=$tmp/run/heartbeat/rank_00001.json
    pid=$(/usr/bin/python3 -c "import json; print(json.load(open('$f'))['pid'])" 2>/dev/null || true)
    if [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null; then
      kills+=("$(date +%s.%N)")
      echo "killed rank 1 (pid $pid) at $(printf %.0f "$elapsed") s"
    fi
  fi
  sleep 1
done
kill -TERM "$sup"
wait "$sup" || true
tail -n 3 "$tmp/launch.log"
/usr/bin/python3 - "$tmp/run" "${kills[@]}" <<'PY'
import json, sys
run, kills = sys.argv[1], [float(k) for k in sys.argv[2:]]
g = json.load(open(run + "/goodput.json"))
ev = [json.loads(l) for l in open(run + "/events.jsonl")]
fails = [e for e in ev if e.get("event") == "failure" and "attempt" in e]
starts = [e for e in ev if e.get("event") == "job_start"]
health = [e["seconds"] for e in ev if e.get("event") == "health"]
att = g["attempts"]
print("| kill | noticed (s) | restart: cleanup, health, backoff (s) | startup + checkpoint load (s) | death to training (s) | steps recomputed |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for i, k in enumerate(kills):
    if i + 1 >= len(att) or i >= len(fails): break
    a, b = att[i], att[i + 1]
    if b["loop_start"] <= 0: break  # stopped before it trained again
    noticed = a["end"] - k
    restart = b["spawn"] - a["end"]
    startup = b["loop_start"] - b["spawn"]
    lost = a["end_step"] - b["start_step"]
    print(f"| {i+1} | {noticed:.1f} | {restart:.1f} | {startup:.1f} | {b['loop_start'] - k:.1f} | {lost} |")
ms = sorted(json.loads(l)["ms"] for l in open(run + "/metrics.jsonl"))
if ms:
    print(f"step time: median {ms[len(ms)//2]/1e3:.2f} s, 90th percentile {ms[int(0.9*len(ms))]/1e3:.2f} s "
          f"over {len(ms)} steps (steps that overlap a save are slower; this is not in goodput)")
loads = [e for e in ev if e.get("event") == "restart" and "tier" in e]
for tier in ("peer", "shared"):
    t = sorted(e["load_ms"] for e in loads if e["tier"] == tier)
    if t:
        print(f"checkpoint loads from tier {tier}: {len(t)}, median {t[len(t)//2]:.0f} ms (read and verified)")
copies = [e for e in ev if e.get("event") == "checkpoint" and e.get("tier") == "peer"]
if copies:
    c = sorted(e["total_ms"] for e in copies)
    print(f"tier-0 copies: {len(copies)}, median {c[len(c)//2]:.0f} ms from snapshot to held, "
          f"{sum(1 for e in ev if e.get('event') == 'checkpoint_failed')} failed")
print(f"health check: median {sorted(health)[len(health)//2]:.2f} s over {len(health)} checks")
print(f"goodput {100*g['goodput']:.1f}% of {g['wall_s']:.0f} s wall, {g['restarts']} restarts: "
      f"useful {g['useful_s']:.0f} s, recomputed {g['recompute_s']:.0f} s, noticing {g['detect_s']:.0f} s, "
      f"restarting {g['restart_s']:.0f} s, startup {g['startup_s']:.0f} s, other {g['other_s']:.0f} s")
PY
