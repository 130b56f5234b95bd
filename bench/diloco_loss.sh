#!/usr/bin/env bash
# What DiLoCo costs in loss: the same model, data, tokens and schedule trained by DP replicas of
# one rank and one thread each (mpirun -np DP on this machine), synchronous data parallelism (the
# peer, first) against each DiLoCo setting in SETTINGS, in one invocation. Prints the validation
# loss at every evaluation side by side and each setting's difference from the peer at the last
# one; the bytes each replica sent per step. A SETTINGS entry is H:FORMAT:OUTER_LR:MOMENTUM
# (inner steps, pseudo-gradients' wire format, the outer step's learning rate and Nesterov
# momentum; the paper's are 0.7 and 0.9).
#   [MODEL=gpt2] [T=256] [B=2] [STEPS=2000] [DP=2] [LR=3e-4] [VAL_EVERY=500] [VAL_BATCHES=64] \
#   [SETTINGS="50:int8:0.7:0.9 50:int8:1:0"] bench/diloco_loss.sh [KEEL]
# B is the global batch (B / DP rows a replica a step); the quickstart's Brown corpus splits
# (data/brown, made by scripts/setup.sh) are the data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keel=$(realpath "${1:-$root/build/keel}")
model=${MODEL:-gpt2} T=${T:-256} B=${B:-2} steps=${STEPS:-2000} dp=${DP:-2} lr=${LR:-3e-4}
read -r -a settings <<<"${SETTINGS:-50:int8:0.7:0.9 50:int8:1:0}"
[[ -f $root/data/brown/train/meta.json ]] ||
  { echo "diloco_loss: no $root/data/brown (scripts/setup.sh prepares it)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--set model.name="$model" --set data.train="$root/data/brown/train"
        --set data.val="$root/data/brown/val" --set data.seq_len="$T" --set train.batch_size="$B"
        --set train.steps="$steps" --set optim.lr="$lr" --set optim.min_lr="$(
          /usr/bin/python3 -c "print($lr / 10)")" --set optim.warmup_steps=$((steps / 20))
        --set train.val_every="${VAL_EVERY:-500}" --set train.val_batches="${VAL_BATCHES:-64}"
        --set train.sample_count=0 --set train.log_every=100 --set checkpoint.every_minutes=0
        --set checkpoint.at_end=false --set checkpoint.save_final=false --set train.out_dir="$tmp")
run() {  # NAME EXTRA...
  local name=$1
  shift
  mpirun --oversubscribe --allow-run-as-root -np "$dp" -x OMP_NUM_THREADS=1 "$keel" train \
    "$root/configs/quickstart.toml" "${common[@]}" --set train.name="$name" "$@" \
    >"$tmp/$name.log" 2>&1 || { echo "$name failed:"; tail "$tmp/$name.log"; exit 1; }
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores;" \
  "$model T=$T, global batch $B over $dp replicas, $steps steps, lr $lr"
start=$(date +%s)
run sync
echo "sync: $(($(date +%s) - start)) s"
names=(sync)
for s in "${settings[@]}"; do
  IFS=: read -r h w olr mom <<<"$s"
  name=diloco-h$h-$w-lr$olr-m$mom
  start=$(date +%s)
  run "$name" --set parallel.dp_sync=diloco --set diloco.inner_steps="$h" \
    --set parallel.grad_comm="$w" --set diloco.outer_lr="$olr" --set diloco.outer_momentum="$mom"
  echo "$name: $(($(date +%s) - start)) s"
  names+=("$name")
done
/usr/bin/python3 - "$tmp" "${names[@]}" <<'PY'
import json, sys
tmp, names = sys.argv[1], sys.argv[2:]
def rows(n):
    return [json.loads(l) for l in open(f"{tmp}/{n}/metrics.jsonl")]
val = {n: {r["step"]: r["val_loss"] for r in rows(n) if "val_loss" in r} for n in names}
sent = {n: sum(r.get("grad_comm_bytes", 0) + r.get("diloco_bytes", 0) for r in rows(n) if "ms" in r)
        / max(1, sum(1 for r in rows(n) if "ms" in r)) for n in names}
steps = sorted(val["sync"])
print(f"{'run':<28}" + "".join(f"{'val@' + str(s):>10}" for s in steps) + f"{'vs sync':>10}{'MB/step':>10}")
for n in names:
    last = (val[n][steps[-1]] - val["sync"][steps[-1]]) / val["sync"][steps[-1]]
    print(f"{n:<28}" + "".join(f"{val[n][s]:>10.4f}" for s in steps) +
          f"{'' if n == 'sync' else f'{100 * last:+.2f}%':>10}{sent[n] / 1e6:>10.2f}")
PY
