#!/usr/bin/env bash
# What LoRA's frozen base saves per step, against full fine-tuning in the same invocation (the
# peer): the same model, data, batch and precision, rank-16 adapters on all four products of
# every block, alternated REPS times; tokens/s over steps 4-12 (the first ones warm up) and the
# ratio LoRA / full; and LoRA with dropout 0.1 on the adapters' inputs, whose masks cost a pass
# over each adapted product's input (forward, and twice in backward), as a ratio to plain LoRA;
# and DoRA ([lora] dora), whose row norms of W + s·B·A, rescaling passes and kept products cost
# more, without and with dropout 0.1 (PEFT's form: one more base product each way), as ratios to
# plain LoRA. keel's own numbers: no other trainer here.
#   bench/lora_step.sh                      # MODEL=gpt2-mini T=256 B=8 PRECISION=bf16 REPS=3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keel=${BUILD:-$root/build}/keel
model=${MODEL:-gpt2-mini} T=${T:-256} B=${B:-8} precision=${PRECISION:-bf16} reps=${REPS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 4000000 "$root/../shared/data/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set model.name="$model" --set data.train="$tmp/tokens.u16" --set data.seq_len="$T"
        --set train.batch_size="$B" --set train.precision="$precision" --set train.steps=12
        --set train.val_every=0 --set train.sample_count=0 --set checkpoint.save_final=false
        --set train.out_dir="$tmp")
OMP_NUM_THREADS=$(nproc) "$keel" train "$root/configs/test-tiny.toml" "${common[@]}" \
  --set train.name=base --set train.steps=1 --set checkpoint.save_final=true >/dev/null 2>&1
echo "model $model, T=$T, B=$B, $precision, $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for rep in $(seq "$reps"); do
  for kind in full lora dropout dora doradrop; do
    extra=()
    [[ $kind != full ]] && extra=(--set lora.rank=16 --set lora.targets=all)
    [[ $kind == dropout ]] && extra+=(--set lora.dropout=0.1)
    [[ $kind == dora* ]] && extra+=(--set lora.dora=true)
    [[ $kind == doradrop ]] && extra+=(--set lora.dropout=0.1)
    rm -rf "$tmp/$kind"
    OMP_NUM_THREADS=$(nproc) "$keel" train "$root/configs/test-tiny.toml" "${common[@]}" \
      --set train.name=$kind --set model.init_from="$tmp/base/model.safetensors" "${extra[@]}" \
      >"$tmp/$kind.log" 2>&1 || { cat "$tmp/$kind.log"; exit 1; }
  done
  /usr/bin/python3 - "$tmp" "$rep" <<'PY'
import json, sys
d, rep = sys.argv[1], sys.argv[2]
def rate(name):
    rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl")][3:]
    # tokens over time: tokens_per_s × ms is each step's tokens (in ms units)
    return sum(r["tokens_per_s"] * r["ms"] for r in rows) / sum(r["ms"] for r in rows)
full, lora, drop = rate("full"), rate("lora"), rate("dropout")
dora, dd = rate("dora"), rate("doradrop")
print(f"rep {rep}: full fine-tuning {full:8.0f} tokens/s, LoRA r=16 all products {lora:8.0f} "
      f"tokens/s, LoRA / full {lora / full:.2f}x; with dropout 0.1 {drop:8.0f} tokens/s, "
      f"{drop / lora:.2f}x LoRA's; DoRA {dora:8.0f} tokens/s, {dora / lora:.2f}x LoRA's; DoRA with "
      f"dropout 0.1 {dd:8.0f} tokens/s, {dd / lora:.2f}x LoRA's")
PY
done
