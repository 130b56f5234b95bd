#!/usr/bin/env bash
# keel ckpt export --adapter against PEFT's rules (peft_reference.py), for a GPT-2 and a Llama:
# a tiny base trained a few steps, a LoRA run on all four products from it, the base exported to
# Hugging Face, the adapters exported, and PyTorch's merge of them must give keel's logits. Then
# keel reads them back: eval and greedy generate of the base plus --adapter give the LoRA run's,
# and [model] init_adapter starts a run from the same merged weights (one step at lr 1e-30).
# The same for DoRA adapters ([lora] dora: PEFT's use_dora and lora_magnitude_vector): PyTorch's
# DoRA merge gives keel's logits, and eval of the base plus --adapter gives the DoRA run's.
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
  ev=(--data "$tmp/tokens.u16" --seq-len 32 --max-tokens 4096 --precision fp32 --json)
  a=$("$keel" eval "$tmp/$model-lora" "${ev[@]}")
  b=$("$keel" eval "$tmp/$model-base/model.safetensors" --adapter "$tmp/$model-adapter" "${ev[@]}")
  "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=$model-init \
    --set train.steps=1 --set optim.lr=1e-30 --set optim.min_lr=0 --set model.init_adapter="$tmp/$model-adapter" \
    --set model.init_from="$tmp/$model-base/model.safetensors" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log"; exit 1; }
  c=$("$keel" eval "$tmp/$model-init/model.safetensors" "${ev[@]}")
  "$py" - "$a" "$b" "$c" <<'PY'
import json, sys
a, b, c = (json.loads(x)["loss"] for x in sys.argv[1:])
print(f"eval: LoRA run {a!r}, base + --adapter {b!r}, init_adapter {c!r}")
assert abs(a - b) <= 1e-6 * abs(a) and abs(a - c) <= 1e-6 * abs(a), "the adapter read back differs"
PY
  "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=$model-dora \
    --set train.steps=4 --set lora.rank=4 --set lora.alpha=6 --set lora.targets=all \
    --set lora.dora=true --set model.init_from="$tmp/$model-base/model.safetensors" >"$tmp/log" 2>&1 ||
    { cat "$tmp/log"; exit 1; }
  "$keel" ckpt export "$tmp/$model-dora" --adapter --out "$tmp/$model-dora-adapter"
  "$dump" "$tmp/$model-dora" "$tmp/$model-dora-logits.safetensors" >/dev/null
  "$py" "$src/tests/reference/peft_reference.py" "$base" "$tmp/$model-dora-adapter" \
    "$tmp/$model-dora-logits.safetensors"
  a=$("$keel" eval "$tmp/$model-dora" "${ev[@]}")
  b=$("$keel" eval "$tmp/$model-base/model.safetensors" --adapter "$tmp/$model-dora-adapter" "${ev[@]}")
  "$py" - "$a" "$b" <<'PY'
import json, sys
a, b = (json.loads(x)["loss"] for x in sys.argv[1:])
print(f"eval: DoRA run {a!r}, base + --adapter {b!r}")
assert abs(a - b) <= 1e-6 * abs(a), "the DoRA adapter read back differs"
PY
  g=(--prompt "The" --temperature 0 --max-tokens 12)
  [[ $("$keel" generate --run "$tmp/$model-lora" "${g[@]}") == \
     $("$keel" generate --run "$tmp/$model-base/model.safetensors" --adapter "$tmp/$model-adapter" \
       "${g[@]}") ]] || { echo "generate with --adapter differs from the LoRA run"; exit 1; }
done
rc=0
"$keel" ckpt export "$tmp/gpt2-tiny-base" --adapter --out "$tmp/none" >"$tmp/log" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "has no LoRA adapters" "$tmp/log" || { echo "exit $rc"; cat "$tmp/log"; exit 1; }
rc=0
"$keel" eval "$tmp/llama-tiny-base/model.safetensors" --adapter "$tmp/gpt2-tiny-adapter" \
  --data "$tmp/tokens.u16" --seq-len 32 >"$tmp/log" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "name no module of this model" "$tmp/log" ||
  { echo "a GPT-2 adapter on a Llama: exit $rc"; cat "$tmp/log"; exit 1; }
