#!/usr/bin/env bash
# The step on links like a cluster's: the quickstart model (gpt2-mini, 16.1M parameters, bf16,
# batch 16 x 128) trained data-parallel over two network-namespace hosts (one rank of one thread
# each; tests/cluster/netns.sh), with each host's link limited by cluster_link_rate to each RATE
# in turn. Prints per rate the median step, the time the step waited on the gradients' all-reduce
# (dp_wait_ms), the bytes each rank sent, and the step's slowdown against the unlimited link, the
# peer run in the same invocation. With WIRES (e.g. WIRES="fp32 bf16 int8"), each rate runs once
# per [parallel] grad_comm format and prints each one's step against fp32's at that rate (the
# peer), the gradient bytes it sent, and its loss after the last step. A WIRES entry
# diloco:H:FORMAT runs DiLoCo (dp_sync = "diloco", H inner steps, pseudo-gradients in FORMAT);
# diloco:H:FORMAT:F:TAU streaming DiLoCo (F fragments, each landing TAU inner steps after its send).
# Steps and bytes are means over steps 3 to the last but one (DiLoCo's outer steps are rare and
# long; its last step ends every round at once, a cost paid once per run, not per step). Needs root.
# HOSTS (default 2) hosts of one rank each; TRAIN_ARGS: --set overrides after the quickstart's
# (e.g. GPT-2 124M: "--set model.name=gpt2 --set data.seq_len=256 --set train.batch_size=16").
# PEER_STEPS (default STEPS): the fp32 peer's steps; the figures are means per step, and DiLoCo
# needs more than H steps to hold one outer step where a synchronous step repeats itself. A WIRES
# entry WIRE@N runs N steps instead (e.g. "bf16@8 int8@8 diloco:50:int8" with STEPS 55).
# ALONE=1: first, each host trains its rank's share of the batch alone (dp 1, no communication),
# all hosts at once so that they share the machine as the data-parallel ranks do (PEER_STEPS
# steps); every line then gives its scaling efficiency, the alone step over its step.
#   [WIRES="fp32 bf16 int8 diloco:4:int8"] [HOSTS=4] [TRAIN_ARGS="..."] [PEER_STEPS=8] [ALONE=1] \
#     bench/link_rate_bench.sh [KEEL] [STEPS] [RATES...]   (default: 8 steps; 10gbit 1gbit
#                                                           200mbit; fp32)
set -euo pipefail
keel=$(realpath "${1:-build/keel}")
steps=${2:-8}
shift $(($# > 2 ? 2 : $#))
rates=("$@")
((${#rates[@]})) || rates=(10gbit 1gbit 200mbit)
read -r -a wires <<<"${WIRES:-fp32}"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
hosts=${HOSTS:-2}
[[ ${wires[0]} == fp32 ]] || wires=(fp32 "${wires[@]}")  # the peer runs first
src=$(cd "$(dirname "$0")/.." && pwd)
shared=$src/../shared/data
# shellcheck source=../tests/cluster/netns.sh
source "$src/tests/cluster/netns.sh"
p=klr
tmp=$(mktemp -d)
trap 'cluster_down "$p" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
cluster_down "$p" >/dev/null 2>&1 || true
cluster_up "$p" "$hosts"
cluster_mpi_env "$p"
cluster_hostfile "$p" "$tmp/hosts" 1

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
  "$hosts hosts of one rank${TRAIN_ARGS:+; $TRAIN_ARGS}"
run() {  # NAME WIRE STEPS: the quickstart over the hosts, one rank each
  local sync=() h w f t
  if [[ $2 == diloco:* ]]; then
    IFS=: read -r _ h w f t <<<"$2"
    sync=(--set parallel.dp_sync=diloco --set diloco.inner_steps="$h" --set parallel.grad_comm="$w"
          --set diloco.fragments="${f:-1}" --set diloco.overlap_steps="${t:-0}")
  else
    sync=(--set parallel.grad_comm="$2")
  fi
  timeout 1800 mpirun --hostfile "$tmp/hosts" -np "$hosts" --map-by node -x OMP_NUM_THREADS=1 \
    "$keel" train "${train[@]}" --set train.steps="$3" "${sync[@]}" --set train.name="$1" \
    >"$tmp/$1.log" 2>&1 || { echo "$1 failed:"; tail "$tmp/$1.log"; exit 1; }
}
train=("$src/configs/quickstart.toml" --set data.train="$shared/brown/brown.gpt2.u16"
       --set data.val= --set train.val_every=0 --set train.sample_count=0 --set train.log_every=1
       --set checkpoint.every_minutes=0 --set checkpoint.save_final=false "${train_args[@]}"
       --set train.out_dir="$tmp")
stats() {  # NAME -> "ms dp_wait_ms MB_sent MB_of_gradients last_loss", means over steps 3..N-1
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
mean = lambda f: statistics.mean(f(r) for r in rows[2:-1])
grads = lambda r: r.get("grad_comm_bytes", 0) + r.get("diloco_bytes", 0)
print(f"{mean(lambda r: r['ms']):.0f} {mean(lambda r: r.get('dp_wait_ms', 0)):.0f} "
      f"{mean(lambda r: r['comm_bytes'] + r.get('diloco_bytes', 0)) / 1e6:.1f} "
      f"{mean(grads) / 1e6:.1f} {rows[-1]['loss']:.4f}")
PY
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

alone=
if [[ ${ALONE:-0} == 1 ]]; then
  batch=16  # the quickstart's global batch, unless TRAIN_ARGS sets another
  for a in "${train_args[@]}"; do [[ $a == train.batch_size=* ]] && batch=${a#*=}; done
  for ((i = 1; i <= hosts; ++i)); do
    OMP_NUM_THREADS=1 timeout 1800 "$keel" train "${train[@]}" --set train.batch_size=$((batch / hosts)) \
      --set train.steps="${PEER_STEPS:-$steps}" --set train.name="alone$i" >"$tmp/alone$i.log" 2>&1 &
  done
  for ((i = 1; i <= hosts; ++i)); do
    wait -n || { echo "a rank alone failed:"; tail "$tmp"/alone*.log; exit 1; }
  done
  alone=$(for ((i = 1; i <= hosts; ++i)); do stats "alone$i"; done | awk '{ s += $1 } END { printf "%.0f", s / NR }')
  echo "alone      $hosts x dp 1     $alone ms/step (each host its rank's $((batch / hosts)) rows, no communication, side by side)"
fi
base=
for r in unlimited "${rates[@]}"; do
  if [[ $r != unlimited ]]; then
    for ((i = 1; i <= hosts; ++i)); do cluster_link_rate "$p" "$i" "$r"; done
  fi
  peer=
  for w in "${wires[@]}"; do
    n=$steps
    [[ $w == fp32 ]] && n=${PEER_STEPS:-$steps}
    [[ $w == *@* ]] && n=${w#*@} w=${w%@*}
    run "${r}_${w//:/-}" "$w" "$n"
    read -r ms wait sent grads loss < <(stats "${r}_${w//:/-}")
    base=${base:-$ms}
    peer=${peer:-$ms}
    line=$(printf '%-10s %-14s %6s ms/step, %5s ms waiting on dp, %5s MB sent per rank (%5s of gradients), loss %s' \
      "$r" "$w" "$ms" "$wait" "$sent" "$grads" "$loss")
    [[ $r == unlimited && $w == fp32 ]] || line+=": $(ratio "$ms" "$base")x unlimited fp32"
    [[ $w == fp32 ]] || line+=", $(ratio "$ms" "$peer")x fp32 at $r"
    [[ -z $alone ]] || line+="; scaling $(awk -v a="$alone" -v b="$ms" 'BEGIN { printf "%.0f%%", 100 * a / b }')"
    echo "$line"
  done
done
