#!/usr/bin/env bash
# keel launch under a local Slurm (slurmctld + one slurmd per network-namespace host, netns.sh):
# inside an allocation of 2 hosts x 2 tasks the supervisor starts the ranks with srun; a rank on
# host 2 is SIGKILLed at a random step; the supervisor restarts within the allocation and the
# final weights equal the uninterrupted run's bitwise. The killed run keeps tier-0 copies every 3
# steps: its holders start with srun beside the job's steps (--overlap) and answer, and the
# restart resumes from the newest of a copy and a shared checkpoint. Needs root and slurm-wlm +
# munge; fails, not skips, without them.
#   tests/cluster/launch_slurm.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh
source "$here/netns.sh"
# shellcheck source=../resilience/launch_lib.sh
source "$here/../resilience/launch_lib.sh"
p=ks
command -v slurmctld >/dev/null && command -v munged >/dev/null ||
  { echo "launch_slurm: slurm-wlm and munge are not installed (scripts/setup.sh installs them)"; exit 1; }
tmp=$(mktemp -d)
cleanup() {
  cluster_down "$p" >/dev/null 2>&1 || true
  pkill -KILL -f "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cluster_down "$p" >/dev/null 2>&1 || true
cluster_up "$p" 2 || { echo "launch_slurm: cannot make network-namespace hosts (root needed)"; exit 1; }
slurm_up "$p" || { echo "launch_slurm: the local Slurm did not start"; exit 1; }
export OMP_NUM_THREADS=1

head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
        --set train.batch_size=8 --set train.micro_batch_size=2 --set optim.lr=3e-3
        --set checkpoint.every_steps=5 --set checkpoint.every_minutes=0
        --set parallel.comm_timeout_s=10 --set launch.heartbeat_s=0.5
        --set launch.heartbeat_timeout_s=20 --set launch.backoff_s=0.2
        --set launch.health_timeout_s=20)

launch() {  # NAME EXTRA...: keel launch inside a fresh allocation, in the background (pid in $sup)
  local name=$1
  shift
  salloc --quiet -N 2 --ntasks-per-node=2 "$keel" launch "$src/configs/test-tiny.toml" \
    "${common[@]}" --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 &
  sup=$!
}

launch ref
finish ref 0
expect ref "keel launch: slurm launcher, hosts ${p}1, ${p}2, 2 rank(s) per host"
expect ref "start 1: 4 rank(s) on ${p}1, ${p}2, dp 4"
expect ref "keel launch: finished at step 40"

step=$((RANDOM % 20 + 5))
rank=$((RANDOM % 2 + 2))
launch kill --set checkpoint.peer_every=3
[[ $(beat kill "$rank" "$step" host) == "$p"2 ]] || { echo "kill: rank $rank is not on ${p}2"; exit 1; }
kill -KILL "$(beat kill "$rank" "$step" pid)"
finish kill 0
expect kill "start 1 failed"
expect kill "start 2: 4 rank(s) on ${p}1, ${p}2, dp 4"
expect kill "keel launch: finished at step 40"
cmp "$tmp/ref/model.safetensors" "$tmp/kill/model.safetensors" ||
  { echo "kill: final weights differ from the uninterrupted run"; exit 1; }
held=$(grep -c '"event":"holder_start".*"ok":true' "$tmp/kill/events.jsonl" || true)
((held >= 2)) || { echo "kill: $held tier-0 holders answered under srun, expected 2"; cat "$tmp/kill.log"; exit 1; }
grep -q '"event":"checkpoint".*"tier":"peer"' "$tmp/kill/events.jsonl" ||
  { echo "kill: no tier-0 copy was held"; exit 1; }
tier=$(/usr/bin/python3 -c "import json,sys; print(' '.join(f\"{j['tier']} step {j['step']}\" for j in map(json.loads, open(sys.argv[1])) if j.get('event') == 'restart' and 'tier' in j))" "$tmp/kill/events.jsonl")
echo "slurm kill: rank $rank on ${p}2 killed after step $step; srun restarted it in the allocation; resumed from ${tier:-?}; bitwise the same weights"
echo "slurm kill: $(grep -m1 'start 1 failed' "$tmp/kill.log")"
