#!/usr/bin/env bash
# Tier-0 checkpoints under keel launch on two network-namespace hosts (2 ranks each, dp 4), with
# [checkpoint] peer_every = 3 and the shared checkpoint every 30 steps:
#   buddy  host 2 dies (every process in its namespace: ranks, MPI daemon, holder) after a tier-0
#          copy newer than the shared checkpoint: the restart loads that copy, host 2's files from
#          the buddy's copy on host 1's holder (the restart event says tier "peer" and counts
#          them), and the final weights equal the uninterrupted run's bitwise;
#   disk   with [launch] holder_spill_dir, both hosts' processes die after step 14 but their
#          disks do not: the new holders start with what they had spilled, and the restart loads
#          the tier-0 copy from there (every file "reloaded from a holder's local disk"), bitwise;
#   both   both hosts die after step 33 with memory-only holders: no copy survives, the restart
#          loads the shared checkpoint of step 30 (tier "shared"), bitwise again.
# Needs root (network namespaces); fails, not skips, without them.
#   tests/cluster/peer_tier.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh
source "$here/netns.sh"
# shellcheck source=../resilience/launch_lib.sh
source "$here/../resilience/launch_lib.sh"
p=kp
tmp=$(mktemp -d)
cleanup() {
  cluster_down "$p" >/dev/null 2>&1 || true
  pkill -KILL -f "$tmp" 2>/dev/null || true
  if [[ -n ${KEEP_TMP:-} ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
cluster_down "$p" >/dev/null 2>&1 || true
cluster_up "$p" 2 || { echo "peer_tier: cannot make network-namespace hosts (root and iproute2 needed)"; exit 1; }
cluster_mpi_env "$p"
export OMP_NUM_THREADS=1

head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
printf '%s1 slots=2\n%s2 slots=2\n' "$p" "$p" >"$tmp/hosts2"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
        --set train.batch_size=8 --set train.micro_batch_size=2 --set optim.lr=3e-3
        --set checkpoint.every_steps=30 --set checkpoint.every_minutes=0
        --set parallel.comm_timeout_s=5 --set launch.heartbeat_s=0.5
        --set launch.heartbeat_timeout_s=20 --set launch.backoff_s=0.2
        --set launch.health_timeout_s=5)

launch() {  # NAME EXTRA... (in the background; pid in $sup)
  local name=$1
  shift
  "$keel" launch "$src/configs/test-tiny.toml" --hostfile "$tmp/hosts2" "${common[@]}" \
    --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 &
  sup=$!
}

# The one restart event of a run, as "TIER STEP OWN BUDDY DISK".
restart_event() {
  /usr/bin/python3 - "$tmp/$1/events.jsonl" <<'PY'
import json, sys
r = [j for j in map(json.loads, open(sys.argv[1])) if j.get("event") == "restart" and "tier" in j]
assert len(r) == 1, f"expected one restart event from the trainer, got {len(r)}"
j = r[0]
print(j["tier"], j["step"], int(j.get("files_from_own_copies", 0)), int(j.get("files_from_buddy_copies", 0)),
      int(j.get("files_from_local_disk", 0)))
PY
}

launch ref
finish ref 0

# --- buddy: host 2 dies after a tier-0 copy that is newer than the shared checkpoint ---
launch buddy --set checkpoint.peer_every=3
beat buddy 0 14 step >/dev/null
cluster_kill "$p" 2
finish buddy 0
expect buddy "start 2: 4 rank(s) on $p""1, $p""2, dp 4"
read -r tier step own buddy_files disk < <(restart_event buddy)
[[ $tier == peer ]] || { echo "buddy: restarted from tier \"$tier\", expected \"peer\""; cat "$tmp/buddy.log"; exit 1; }
((step >= 12 && step < 30 && step % 3 == 0)) || { echo "buddy: restarted from step $step, expected a tier-0 copy of 12..27"; exit 1; }
# Each of host 2's two files is read by every one of the 4 ranks, from the buddy's copy on host 1.
((buddy_files >= 8)) || { echo "buddy: $buddy_files file reads from the buddy's copies, expected >= 8 (own copies: $own)"; exit 1; }
grep -q "read the buddy's copy of rank_0000[23].bin from ${p}1" "$tmp/buddy/logs/"* ||
  { echo "buddy: no rank says it read host 2's files from ${p}1"; exit 1; }
grep -q '"event":"holder_lost".*"host":"'"$p"'2"' "$tmp/buddy/events.jsonl" ||
  grep -q '"event":"holder_start".*"host":"'"$p"'2"' "$tmp/buddy/events.jsonl" ||
  { echo "buddy: no holder event for ${p}2"; exit 1; }
cmp "$tmp/ref/model.safetensors" "$tmp/buddy/model.safetensors" ||
  { echo "buddy: final weights differ from the uninterrupted run"; exit 1; }
((disk == 0)) || { echo "buddy: $disk files from a local disk, but no holder spills"; exit 1; }
# Rank 0's copies to its own host's holder went by descriptor (PUTFD), the buddy's over TCP.
grep -q '"handed_over":true' "$tmp/buddy/events.jsonl" ||
  { echo "buddy: no tier-0 copy was handed over to its own host's holder by descriptor"; exit 1; }
echo "buddy: host ${p}2 killed after step 14; resumed from the tier-0 copy of step $step ($own file reads from own copies, $buddy_files from the buddy's); bitwise the same weights"

# --- disk: every process dies, the disks stay: the holders start again with their spilled copies ---
launch disk --set checkpoint.peer_every=3 --set launch.holder_spill_dir="$tmp/spill-{host}"
beat disk 0 14 step >/dev/null
cluster_kill "$p" 1
cluster_kill "$p" 2
finish disk 0
read -r tier step own _ disk < <(restart_event disk)
[[ $tier == peer ]] || { echo "disk: restarted from tier \"$tier\", expected \"peer\" (the spilled copies)"; cat "$tmp/disk.log"; exit 1; }
((step >= 12 && step < 30)) || { echo "disk: restarted from step $step, expected a tier-0 copy of 12..27"; exit 1; }
((disk == own && disk >= 16)) || { echo "disk: $disk of $own file reads from a local disk, expected all (>= 16)"; exit 1; }
[[ -d $tmp/spill-${p}1 && -d $tmp/spill-${p}2 ]] || { echo "disk: no spill folder per host"; exit 1; }
cmp "$tmp/ref/model.safetensors" "$tmp/disk/model.safetensors" ||
  { echo "disk: final weights differ from the uninterrupted run"; exit 1; }
echo "disk: both hosts' processes killed after step 14; the holders reloaded their spilled copies; resumed from step $step ($disk file reads from local disk); bitwise the same weights"

# --- both: every copy's host dies: the shared checkpoint ---
launch both --set checkpoint.peer_every=3
beat both 0 33 step >/dev/null
cluster_kill "$p" 1
cluster_kill "$p" 2
finish both 0
read -r tier step _ _ < <(restart_event both)
[[ $tier == shared && $step == 30 ]] || { echo "both: restarted from tier \"$tier\" step $step, expected the shared checkpoint of step 30"; exit 1; }
cmp "$tmp/ref/model.safetensors" "$tmp/both/model.safetensors" ||
  { echo "both: final weights differ from the uninterrupted run"; exit 1; }
echo "both: both hosts killed after step 33; no tier-0 copy left, resumed from the shared checkpoint of step 30; bitwise the same weights"
