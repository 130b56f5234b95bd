#!/usr/bin/env bash
# Data-parallel gradients on the wire in bf16 and int8 ([parallel] grad_comm) through `keel
# train`, the tiny bf16 GPT over 40 steps:
#  1. at dp 2 (ZeRO 0, 1, 2 and 3) and dp 4 (ZeRO 1 and 2), every step's loss within 0.5% of the
#     fp32 wire's, and the weights not the fp32 wire's (the format did something); so too with
#     the other paths to the sums: bf16 gradient buffers, LoRA's adapters (the frozen base sends
#     nothing), fp16 with loss scaling, and dp 2 x tp 2;
#  2. grad_comm_bytes (the gradient sums' part of comm_bytes) per step: bf16 half of fp32's, int8 a quarter (plus its block scales);
#  3. int8's error-feedback residual is saved (one tensor per rank in the manifest) and a stop at
#     step 20 with --resume auto ends with the uninterrupted run's weights bitwise; a resume from
#     a checkpoint without residuals says that they start from zero;
#  4. an unknown format is refused with one line.
#   tests/train/grad_comm.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_bf16 "$shared"

bytes_ratio() {  # bytes_ratio NAME REF LO HI: the mean grad_comm_bytes per step, NAME / REF in [LO, HI]
  /usr/bin/python3 - "$@" "$tmp" <<'PY'
import json, sys
name, ref, lo, hi, tmp = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def mean(n):
    v = [d["grad_comm_bytes"] for d in map(json.loads, open(f"{tmp}/{n}/metrics.jsonl")) if "grad_comm_bytes" in d]
    assert v, n
    return sum(v) / len(v)
r = mean(name) / mean(ref)
print(f"{name}: {mean(name) / 1e6:.3f} MB sent per step and rank, {r:.4f} of {ref}'s "
      f"(expected {lo}..{hi})")
sys.exit(not lo <= r <= hi)
PY
}
differ() {
  ! cmp -s "$tmp/$1/model.safetensors" "$tmp/$2/model.safetensors" ||
    { echo "$1 ends with $2's weights: grad_comm did nothing"; exit 1; }
}

for z in 0 1 2 3; do
  run "ref_z$z" 2 --set parallel.zero=$z
  for w in bf16 int8; do
    run "${w}_z$z" 2 --set parallel.zero=$z --set parallel.grad_comm=$w
    close "${w}_z$z" "ref_z$z"
    differ "${w}_z$z" "ref_z$z"
  done
  bytes_ratio "bf16_z$z" "ref_z$z" 0.499 0.501
  bytes_ratio "int8_z$z" "ref_z$z" 0.25 0.26
done
grep -q "gradients travel in int8 (blocks of 256, error feedback)" "$tmp/int8_z1.log" ||
  { echo "int8_z1: the start does not say how gradients travel"; cat "$tmp/int8_z1.log"; exit 1; }
for z in 1 2; do
  run "ref4_z$z" 4 --set parallel.zero=$z
  run "int8_4_z$z" 4 --set parallel.zero=$z --set parallel.grad_comm=int8
  close "int8_4_z$z" "ref4_z$z"
  bytes_ratio "int8_4_z$z" "ref4_z$z" 0.25 0.26
done

# The other paths into the sums, int8 against the same run on the fp32 wire.
pair() {  # pair NAME NP EXTRA...
  local name=$1 np=$2
  shift 2
  run "${name}_ref" "$np" "$@"
  run "$name" "$np" "$@" --set parallel.grad_comm=int8
  close "$name" "${name}_ref"
}
pair gbuf 2 --set optim.grad_dtype=bf16 --set parallel.zero=1
pair lora 2 --set lora.rank=4 --set parallel.zero=1
pair fp16 2 --set train.precision=fp16
pair tp2 4 --set parallel.tp=2

# The residual: one tensor per rank, and an exact resume.
for z in 1 2; do
  run "cut_z$z" 2 --set parallel.zero=$z --set parallel.grad_comm=int8 --set train.stop_at=20
  "$keel" ckpt inspect "$tmp/cut_z$z/checkpoints/step_00000020" --tensors >"$tmp/inspect_z$z.txt"
  for r in 0 1; do
    grep -q "grad_comm.residual.dp${r}of2.tp0of1.pp0of1 *own" "$tmp/inspect_z$z.txt" ||
      { echo "cut_z$z: no residual of rank $r in the checkpoint"; cat "$tmp/inspect_z$z.txt"; exit 1; }
  done
  run "cut_z$z" 2 --set parallel.zero=$z --set parallel.grad_comm=int8 --resume auto
  grep -q "resuming from .*step_00000020" "$tmp/cut_z$z.log" ||
    { echo "cut_z$z did not resume from step 20"; cat "$tmp/cut_z$z.log"; exit 1; }
  same "int8_z$z" "cut_z$z" "int8 at ZeRO $z: stop at 20 and resume"
done
# A bf16-wire checkpoint has no residual: an int8 resume from it says so and goes on.
run switch 2 --set parallel.zero=1 --set parallel.grad_comm=bf16 --set train.stop_at=20
run switch 2 --set parallel.zero=1 --set parallel.grad_comm=int8 --resume auto
grep -q "2 of the ranks' own tensors (int8 residuals, DiLoCo replicas' state) are not in" "$tmp/switch.log" ||
  { echo "switch: no line about the missing residuals"; cat "$tmp/switch.log"; exit 1; }

refused bad_wire 2 "parallel.grad_comm" --set parallel.grad_comm=fp8
