#!/usr/bin/env bash
# keel launch across "hosts" made of network namespaces (netns.sh), mpirun over TCP:
#   kill      SIGKILL a rank on host 2 of a 2-host x 2-rank run at a random step: restarted, the
#             final weights equal the uninterrupted run's bitwise (same layout after the restart);
#   diloco    the same fault in a streaming DiLoCo run (rounds of 4 steps in 2 fragments, each
#             landing a step after its send; checkpoints every 5: mid-round, and the one at step
#             10 with a fragment in flight): each replica resumes its own weights, moments, outer
#             state and what was in flight, and the final weights equal the uninterrupted run's
#             bitwise (tests/train/diloco.sh resumes from a flight deterministically);
#   twice     host 2's ranks killed in two starts of the DiLoCo run: host 2 is excluded, the job
#             shrinks to dp 2, whose replicas go on with the rounds of the checkpoint's replicas 0
#             and 1 (replicas 2 and 3 are dropped from theirs);
#   flap      host 2's link goes down and comes back before the restart: restarted on the same
#             layout, the final weights equal the uninterrupted run's bitwise;
#   linkdown  host 2's link goes down: the job exits 75 within the collective timeout, host 2
#             fails its health check, the run goes on with dp 2 on host 1; when the link is back
#             the supervisor grows the job to dp 4 again; every step's loss is within 1e-5
#             (relative) of one process training the same global batch;
#   spare     the same fault with a spare listed: the run goes on at dp 4 on the spare, and ends
#             bitwise where the uninterrupted run does;
#   bad       host 2 sees a different (broken) data file: exit 2 with that rank's message, no
#             restart;
#   term      SIGTERM to the supervisor: a committed checkpoint, exit 0, nothing left running in
#             any namespace.
# Needs root (network namespaces); fails, not skips, without them.
#   tests/cluster/launch_cluster.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh
source "$here/netns.sh"
# shellcheck source=../resilience/launch_lib.sh
source "$here/../resilience/launch_lib.sh"
p=kl
tmp=$(mktemp -d)
cleanup() {
  cluster_down "$p" >/dev/null 2>&1 || true
  pkill -KILL -f "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cluster_down "$p" >/dev/null 2>&1 || true
cluster_up "$p" 3 || { echo "launch_cluster: cannot make network-namespace hosts (root and iproute2 needed)"; exit 1; }
cluster_mpi_env "$p"
export OMP_NUM_THREADS=1

head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
printf '\1\2\3' >"$tmp/broken.u16"  # 3 bytes: not uint16 tokens
printf '%s1 slots=2\n%s2 slots=2\n' "$p" "$p" >"$tmp/hosts2"
printf '%s1 slots=2\n%s2 slots=2\n%s3 slots=2\n' "$p" "$p" "$p" >"$tmp/hosts3"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
        --set train.batch_size=8 --set train.micro_batch_size=2 --set optim.lr=3e-3
        --set checkpoint.every_steps=5 --set checkpoint.every_minutes=0
        --set parallel.comm_timeout_s=5 --set launch.heartbeat_s=0.5
        --set launch.heartbeat_timeout_s=20 --set launch.backoff_s=0.2
        --set launch.health_timeout_s=5 --set launch.regrow_minutes=0.02)

launch() {  # NAME HOSTFILE EXTRA... (in the background; pid in $sup)
  local name=$1 hosts=$2
  shift 2
  "$keel" launch "$src/configs/test-tiny.toml" --hostfile "$hosts" "${common[@]}" \
    --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 &
  sup=$!
}

launch ref "$tmp/hosts2"
finish ref 0
expect ref "start 1: 4 rank(s) on $p""1, $p""2, dp 4"

# --- kill: a rank on host 2 (rank 2 or 3; ranks fill host 1 first) ---
step=$((RANDOM % 20 + 5))
rank=$((RANDOM % 2 + 2))
launch kill "$tmp/hosts2"
[[ $(beat kill "$rank" "$step" host) == "$p"2 ]] || { echo "kill: rank $rank is not on host 2"; exit 1; }
kill -KILL "$(beat kill "$rank" "$step" pid)"
finish kill 0
expect kill "start 1 failed"
expect kill "rank $rank on $p""2"
expect kill "start 2: 4 rank(s) on $p""1, $p""2, dp 4"
cmp "$tmp/ref/model.safetensors" "$tmp/kill/model.safetensors" ||
  { echo "kill: final weights differ from the uninterrupted run"; exit 1; }
echo "kill: rank $rank on ${p}2 killed after step $step; restarted on the same layout; bitwise the same weights"

# --- diloco: the kill in a streaming DiLoCo run: the replica rejoins from its own state ---
diloco=(--set parallel.dp_sync=diloco --set diloco.inner_steps=4 --set diloco.fragments=2
        --set diloco.overlap_steps=1)
launch dref "$tmp/hosts2" "${diloco[@]}"
finish dref 0
launch dkill "$tmp/hosts2" "${diloco[@]}"
kill -KILL "$(beat dkill "$rank" "$step" pid)"
finish dkill 0
expect dkill "start 2: 4 rank(s) on $p""1, $p""2, dp 4"
cmp "$tmp/dref/model.safetensors" "$tmp/dkill/model.safetensors" ||
  { echo "diloco: final weights differ from the uninterrupted DiLoCo run"; exit 1; }
echo "diloco: rank $rank killed after step $step; each replica resumed its own state; bitwise the same weights"

# --- twice: host 2's ranks fail twice, so host 2 is excluded and the job shrinks to host 1 ---
launch twice "$tmp/hosts2" "${diloco[@]}"
kill -KILL "$(beat twice 2 5 pid)"
for _ in $(seq 600); do grep -q "start 2:" "$tmp/twice.log" && break; sleep 0.1; done
kill -KILL "$(beat twice 3 12 pid)"
finish twice 0
expect twice "host ${p}2 excluded: its ranks failed 2 times"
expect twice "start 3: 2 rank(s) on ${p}1, dp 2 (shrunk"
expect twice "DiLoCo: the checkpoint's 4 replica(s) go on as 2: replicas 0-1 go on with their rounds; replicas 2-3 are dropped from theirs"
expect twice "keel launch: finished at step 40"
echo "twice: $(grep -m1 'excluded' "$tmp/twice.log"); $(grep -m1 -o 'DiLoCo: the checkpoint.*' "$tmp/twice.log")"

# --- flap: host 2's link goes down and is back before the restart: the same layout, bitwise ---
launch flap "$tmp/hosts2" --set launch.backoff_s=2
beat flap 0 8 step >/dev/null
cluster_link_down "$p" 2
down=$(date +%s.%N)
for _ in $(seq 600); do grep -q "start 1 failed" "$tmp/flap.log" && break; sleep 0.1; done
noticed=$(date +%s.%N)
cluster_link_up "$p" 2
finish flap 0
expect flap "start 2: 4 rank(s) on ${p}1, ${p}2, dp 4"
cmp "$tmp/ref/model.safetensors" "$tmp/flap/model.safetensors" ||
  { echo "flap: final weights differ from the uninterrupted run"; exit 1; }
echo "flap: host ${p}2's link down, noticed in $(/usr/bin/python3 -c "print(f'{$noticed - $down:.1f}')") s, back before the restart: same layout, bitwise the same weights"

# --- linkdown: shrink to host 1, grow back when the link returns ---
"$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.steps=60 \
  --set train.name=one >"$tmp/one.log" 2>&1 || { cat "$tmp/one.log"; exit 1; }
launch linkdown "$tmp/hosts2" --set train.steps=60
beat linkdown 0 8 step >/dev/null
cluster_link_down "$p" 2
t0=$(date +%s)
for _ in $(seq 600); do grep -q "start 2:" "$tmp/linkdown.log" && break; sleep 0.1; done
cluster_link_up "$p" 2
finish linkdown 0
expect linkdown "host ${p}2 failed its health check"
expect linkdown "start 2: 2 rank(s) on ${p}1, dp 2 (shrunk"
expect linkdown "host ${p}2 is back"
expect linkdown "4 rank(s) on ${p}1, ${p}2, dp 4"
/usr/bin/python3 - "$tmp/one/metrics.jsonl" "$tmp/linkdown/metrics.jsonl" <<'PY'
import json, sys
one, run = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
a = {m["step"]: m["loss"] for m in one}
b = {m["step"]: m["loss"] for m in run}
assert sorted(a) == sorted(b) == list(range(1, 61)), (sorted(a)[:3], sorted(b)[:3], len(a), len(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
assert worst <= 1e-5, f"loss differs from one process by {worst:.2e} (relative)"
print(f"linkdown: every step's loss within {worst:.1e} of one process")
PY
fail_s=$(/usr/bin/python3 -c "
import json
ev = [json.loads(l) for l in open('$tmp/linkdown/events.jsonl')]
print(round(next(e['time'] for e in ev if e.get('event') == 'failure') - $t0, 1))")
echo "linkdown: failure noticed ${fail_s} s after the link went down (comm_timeout_s = 5); $(grep -m1 'failed its health check' "$tmp/linkdown.log")"

# --- spare: the same fault, host 3 takes host 2's place ---
launch spare "$tmp/hosts3" --set launch.spares="$p"3
beat spare 0 8 step >/dev/null
cluster_link_down "$p" 2
finish spare 0
cluster_link_up "$p" 2
expect spare "start 2: 4 rank(s) on ${p}1, ${p}3, dp 4 (with spare hosts)"
cmp "$tmp/ref/model.safetensors" "$tmp/spare/model.safetensors" ||
  { echo "spare: final weights differ from the uninterrupted run"; exit 1; }
echo "spare: continued at dp 4 on ${p}3; bitwise the same weights as the uninterrupted run"

# --- bad: host 2 sees a broken data file (its own mount namespace) ---
cat >"$tmp/agent.sh" <<EOF
#!/bin/sh
# ns_rsh.sh, but on ${p}2 the data file is the broken one.
for a in "\$@"; do case \$a in -*) ;; *) host=\$a; break ;; esac; done
if [ "\$host" = ${p}2 ]; then
  exec unshare --mount --propagation private sh -c 'mount --bind $tmp/broken.u16 $tmp/tokens.u16 && exec "\$0" "\$@"' "$here/ns_rsh.sh" "\$@"
fi
exec "$here/ns_rsh.sh" "\$@"
EOF
chmod +x "$tmp/agent.sh"
OMPI_MCA_plm_rsh_agent=$tmp/agent.sh launch bad "$tmp/hosts2"
finish bad 2
expect bad "which a restart would not fix"
expect bad "on ${p}2"
(($(supervisor_events bad job_start) == 1)) || { echo "bad: started more than once"; exit 1; }
echo "bad: $(grep -m1 'would not fix' "$tmp/bad.log")"

# --- term: SIGTERM to the supervisor ---
launch term "$tmp/hosts2" --set train.steps=100000
beat term 0 6 step >/dev/null
kill -TERM "$sup"
finish term 0
expect term "stopped, with a checkpoint, at step"
"$keel" ckpt verify "$tmp/term/checkpoints/$(cat "$tmp/term/checkpoints/latest")" >/dev/null
sleep 0.5
for i in 1 2 3; do
  left=$(ip netns pids "$p$i")
  [[ -z $left ]] || { echo "term: processes left in $p$i: $left"; ps -fp "$left"; exit 1; }
done
[[ -z $(pgrep -f -- "train.name=term" || true) ]] || { echo "term: keel processes left"; exit 1; }
echo "term: SIGTERM saved $(cat "$tmp/term/checkpoints/latest"), exit 0, nothing left in any namespace"
