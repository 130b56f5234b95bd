#!/usr/bin/env bash
# keel launch on this machine (2 ranks under mpirun), each case a property that could be false:
#   kill    SIGKILL rank 1 at a random step: the supervisor restarts from the newest checkpoint
#           and the final weights equal the uninterrupted run's bitwise (same layout);
#   silent  SIGSTOP rank 1: the supervisor names it (rank, host, step, phase), restarts, finishes;
#   bad     bad input (exit 2) is not retried: exit 2 with the rank's message, one start only;
#           input keel launch can check itself is refused before the run folder is written;
#   max     a job that always dies: exit 1 after max_restarts restarts, with the failure history;
#   term    SIGTERM to the supervisor: the job saves, exit 0, no keel process left behind;
#   layout  3 ranks that the batch cannot split over: exit 2 before anything is written.
#   tests/resilience/launch_local.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
export OMP_NUM_THREADS=1
# shellcheck source=launch_lib.sh
source "$(dirname "$0")/launch_lib.sh"
common=(--np 2 --set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
        --set checkpoint.every_steps=5 --set checkpoint.every_minutes=0
        --set parallel.comm_timeout_s=20 --set launch.heartbeat_s=0.5
        --set launch.heartbeat_timeout_s=4 --set launch.backoff_s=0.2 --set launch.health_timeout_s=30
        --set launch.launcher_args=--oversubscribe)

launch() {  # NAME EXTRA... (in the background; pid in $sup)
  local name=$1
  shift
  "$keel" launch "$src/configs/test-tiny.toml" "${common[@]}" --set train.name="$name" "$@" \
    >"$tmp/$name.log" 2>&1 &
  sup=$!
}

launch ref
finish ref 0
expect ref "keel launch: finished at step 40"

step=$((RANDOM % 20 + 8))
# Rank 1 sleeps through 7 more step times (KEEL_FAULT slow: the numbers unchanged), so that its
# heartbeat (every 0.5 s) shows the step before the job ends: at 15 ms a step the 40 steps took
# about 1 s and the kill missed its window (2026-12-04, 3 failures in a row).
KEEL_FAULT="slow@0:1,factor=8" launch kill
pid=$(beat kill 1 "$step" pid)
kill -KILL "$pid"
finish kill 0
expect kill "start 1 failed"
expect kill "no last heartbeat: killed or crashed"
expect kill "start 2:"
cmp "$tmp/ref/model.safetensors" "$tmp/kill/model.safetensors" ||
  { echo "kill: final weights differ from the uninterrupted run"; exit 1; }
(($(supervisor_events kill failure) == 1 && $(supervisor_events kill restart) == 1)) ||
  { echo "kill: expected one failure and one restart event"; cat "$tmp/kill/events.jsonl"; exit 1; }
/usr/bin/python3 - "$tmp/kill/goodput.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
assert g["restarts"] == 1 and g["outcome"] == "finished", g
assert 0 < g["goodput"] < 1 and g["recompute_s"] >= 0 and g["detect_s"] > 0, g
parts = sum(g[k] for k in ("useful_s", "recompute_s", "detect_s", "restart_s", "startup_s", "other_s"))
assert abs(parts - g["wall_s"]) < 0.01 * g["wall_s"] + 1e-3, (parts, g)
PY
echo "kill: rank 1 killed after step $step; restarted; final weights equal the uninterrupted run's"

# Slowed like the kill case's rank 1, so that the stop lands mid-run (at full speed the 40 steps
# can end between the heartbeat at step 10 and the SIGSTOP: 2026-12-05, ranks had exited).
KEEL_FAULT="slow@0:1,factor=8" launch silent
pid=$(beat silent 1 10 pid)
kill -STOP "$pid"
finish silent 0
expect silent "rank 1 on $(hostname) (pid $pid) is silent"
expect silent "keel launch: finished at step 40"
cmp "$tmp/ref/model.safetensors" "$tmp/silent/model.safetensors" ||
  { echo "silent: final weights differ"; exit 1; }
echo "silent: $(grep -m1 'is silent' "$tmp/silent.log")"

# Bad input that keel launch can see (a missing dataset) is refused before it writes anything;
# bad input only the ranks find (a missing init_from file) ends the job after one start.
launch early --set data.val="$tmp/missing.u16"
finish early 2
expect early "missing.u16"
[ ! -e "$tmp/early" ] || { echo "early: the run folder was written before the refusal"; exit 1; }
launch bad --set model.init_from="$tmp/missing.safetensors"
finish bad 2
expect bad "which a restart would not fix"
expect bad "missing.safetensors"
(($(supervisor_events bad job_start) == 1)) || { echo "bad: started more than once"; exit 1; }
echo "bad: $(grep -m1 'would not fix' "$tmp/bad.log")"

# shellcheck disable=SC2209 # an environment variable for the function and what it starts
KEEL_CKPT_CRASH_AT=write launch max --set launch.max_restarts=2
finish max 1
expect max "giving up: max_restarts = 2 reached"
expect max "  3. start 3:"
(($(supervisor_events max job_start) == 3)) || { echo "max: expected 3 starts"; exit 1; }
echo "max: gave up after 3 starts, history printed"

launch term --set train.steps=100000
beat term 0 6 pid >/dev/null
kill -TERM "$sup"
finish term 0
expect term "stopped, with a checkpoint, at step"
"$keel" ckpt verify "$tmp/term/checkpoints/$(cat "$tmp/term/checkpoints/latest")" >/dev/null
sleep 0.5
left=$(pgrep -f -- "train.name=term" || true)
[[ -z $left ]] || { echo "term: processes left: $left"; ps -fp "$left"; exit 1; }
echo "term: SIGTERM saved $(cat "$tmp/term/checkpoints/latest"), exit 0, no process left"

rc=0
"$keel" launch "$src/configs/test-tiny.toml" "${common[@]:2}" --np 3 --set train.name=layout \
  --set train.micro_batch_size=2 >"$tmp/layout.log" 2>&1 || rc=$?
((rc == 2)) || { echo "layout: exit $rc, expected 2"; cat "$tmp/layout.log"; exit 1; }
expect layout "[train] batch_size: 4 is not divisible by ranks (3) × micro_batch_size (2)"
[[ ! -e $tmp/layout ]] || { echo "layout: the run folder was written"; exit 1; }
echo "layout: $(grep -m1 "is not divisible" "$tmp/layout.log")"
