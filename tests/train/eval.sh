#!/usr/bin/env bash
# keel eval, end to end:
#  1. the trainer's validation is keel eval's number: a Llama trained at dp 2 in bf16 validates at
#     steps 5 and 10 over val_batches x batch_size windows; keel eval of the step-10 checkpoint with
#     that --max-tokens and the run's micro-batch prints the same loss, bitwise;
#  2. any rank count: keel eval of the whole split on 1, 2 and 3 ranks prints the same loss, bitwise;
#  3. against PyTorch: keel eval (fp32) of the run's model file matches a float64 evaluation of the
#     same windows (tests/reference/eval_reference.py) within 1e-4, for a Llama and a GPT-2, and
#     for the Llama also that of its Hugging Face export run as LlamaForCausalLM;
#  4. bad input: an unknown source, a too-long --seq-len, a dataset of the wrong vocabulary: exit 2
#     with one line naming it.
#   tests/train/eval.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 200000 "$shared/brown/brown.gpt2.u16" >"$tmp/train.u16"
head -c 260000 "$shared/brown/brown.gpt2.u16" | tail -c 60000 >"$tmp/val.u16"
common=(--set data.train="$tmp/train.u16" --set data.val="$tmp/val.u16" --set train.out_dir="$tmp"
        --set train.steps=10 --set train.val_every=5 --set train.val_batches=3
        --set train.batch_size=8 --set optim.lr=3e-3 --set checkpoint.every_steps=10)
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)

OMP_NUM_THREADS=1 "${mpi[@]}" -np 2 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" \
  --set train.name=llama --set model.name=llama-tiny --set train.precision=bf16 >"$tmp/llama.log" 2>&1 ||
  { cat "$tmp/llama.log"; exit 1; }
ckpt="$tmp/llama/checkpoints/step_00000010"
# 3 batches of 8 windows of 32 tokens; dp 2 ran micro-batches of 4.
OMP_NUM_THREADS=1 "$keel" eval "$ckpt" --max-tokens $((3 * 8 * 32)) --batch 4 --json >"$tmp/val10.json"
OMP_NUM_THREADS=1 "${mpi[@]}" -np 3 "$keel" eval "$ckpt" --max-tokens $((3 * 8 * 32)) --batch 4 \
  --json >"$tmp/val10_np3.json"
for np in 1 2 3; do
  OMP_NUM_THREADS=1 "${mpi[@]}" -np "$np" "$keel" eval "$tmp/llama" --json >"$tmp/whole_np$np.json"
done
"$keel" eval "$tmp/llama" | tee "$tmp/whole_text.txt"

/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
bad = 0
val = [json.loads(l)["val_loss"] for l in open(f"{d}/llama/metrics.jsonl") if "val_loss" in l]
ev = json.load(open(f"{d}/val10.json"))
ev3 = json.load(open(f"{d}/val10_np3.json"))
ok = ev["loss"] == val[-1] == ev3["loss"]
print(f"trainer validation at step 10 (dp 2): {val[-1]!r}; keel eval of its checkpoint: "
      f"{ev['loss']!r} (1 rank), {ev3['loss']!r} (3 ranks): {'identical' if ok else 'DIFFERENT'}")
bad |= not ok
whole = [json.load(open(f"{d}/whole_np{n}.json")) for n in (1, 2, 3)]
ok = len({w["loss"] for w in whole}) == 1 and whole[0]["windows"] == (60000 // 2 - 1) // 32
print(f"whole split, {whole[0]['windows']} windows, 1/2/3 ranks: "
      f"{[w['loss'] for w in whole]} {'identical' if ok else 'DIFFERENT'}")
bad |= not ok
sys.exit(bad)
PY

# Against PyTorch, in fp32: the run's final model file, for a Llama and a GPT-2.
OMP_NUM_THREADS=1 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=gpt2 \
  >"$tmp/gpt2.log" 2>&1 || { cat "$tmp/gpt2.log"; exit 1; }
"$keel" ckpt export "$tmp/llama" --out "$tmp/llama_hf" >/dev/null
for model in llama/model.safetensors gpt2/model.safetensors llama_hf; do
  "$keel" eval "$tmp/$model" --data "$tmp/val.u16" --seq-len 32 --max-tokens 4096 \
    --precision fp32 --json >"$tmp/eval.torch.json"
  /usr/bin/python3 "$src/tests/reference/eval_reference.py" "$tmp/$model" \
    "$tmp/val.u16" 32 4096 "$tmp/eval.torch.json"
done

# Bad input: exit 2 and one line naming what was wrong.
expect_refusal() {
  local want=$1 rc=0
  shift
  "$keel" eval "$@" >"$tmp/bad.log" 2>&1 || rc=$?
  if ((rc != 2)) || ! grep -q -- "$want" "$tmp/bad.log" || (($(wc -l <"$tmp/bad.log") != 1)); then
    echo "keel eval $*: exit $rc, expected 2 and one line with \"$want\":"; cat "$tmp/bad.log"; exit 1
  fi
  echo "refused: $(cat "$tmp/bad.log")"
}
expect_refusal "no such file" "$tmp/nothing"
expect_refusal "longer than the model's context" "$tmp/llama" --seq-len 100000
printf '\xff\xff' >"$tmp/big_ids.u16"
head -c 4000 "$tmp/val.u16" >>"$tmp/big_ids.u16"
expect_refusal "big_ids.u16" "$tmp/llama" --data "$tmp/big_ids.u16"
