#!/usr/bin/env bash
# keel ckpt export --adapter against PEFT's rules (peft_reference.py), for a GPT-2 and a Llama:
# a tiny base trained a few steps, a LoRA run on all four products from it, the base exported to
# Hugging Face, the adapters exported, and PyTorch's merge of them must give keel's logits.
#   tests/reference/peft_export.sh KEEL DUMP_LOGITS PYTHON SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 dump=$2 py=$3 src=$4 shared=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 200000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
for model in gpt2-tiny llama-tiny; do
  common=(--set model.name=$model --set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp"
          --set optim.lr=3e-2 --set optim.warmup_steps=0)
  "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=$model-base \
    --set train.steps=3 >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=$model-lora \
    --set train.steps=4 --set lora.rank=4 --set lora.alpha=6 --set lora.targets=all \
    --set model.init_from="$tmp/$model-base/model.safetensors" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log"; exit 1; }
  base="$tmp/$model-hf"
  [[ $model == gpt2-tiny ]] && base="$tmp/$model-hf.safetensors"
  "$keel" ckpt export "$tmp/$model-base/model.safetensors" --out "$base" >/dev/null
  "$keel" ckpt export "$tmp/$model-lora" --adapter --out "$tmp/$model-adapter"
  "$dump" "$tmp/$model-lora" "$tmp/$model-logits.safetensors" >/dev/null
  "$py" "$src/tests/reference/peft_reference.py" "$base" "$tmp/$model-adapter" \
    "$tmp/$model-logits.safetensors"
done
rc=0
"$keel" ckpt export "$tmp/gpt2-tiny-base" --adapter --out "$tmp/none" >"$tmp/log" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "has no LoRA adapters" "$tmp/log" || { echo "exit $rc"; cat "$tmp/log"; exit 1; }
