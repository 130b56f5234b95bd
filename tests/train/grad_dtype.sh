#!/usr/bin/env bash
# bf16 gradient buffers (optim.grad_dtype = "bf16") through `keel train`, bf16 runs at 2 ranks:
#  1. with one micro-batch per rank, ZeRO 0, 1, 2 and 3 end with bitwise-equal weights (each sums
#     the ranks' fp32 buckets and rounds once, whether by all-reduce or reduce-scatter);
#  2. a stop at step 20 and --resume auto to 40 give the uninterrupted run's weights bitwise, and
#     so does the offload tier ([offload] dir: the update reads the bf16 gradients chunk by chunk);
#  3. the weights differ from the fp32-gradient run's (the buffer really is bf16), and every
#     step's loss stays within 0.5% of its (the loss falls from 10.8 to 8.8 over the 40 steps): at one micro-batch, with gradient accumulation at
#     ZeRO 1 and 2 (the bf16 buffer accumulates micro-batches), at tp 2 (with and without
#     sequence parallelism), at pp 2 and in fp16;
#  4. fp32 runs, LoRA and an unknown dtype are refused with one line.
#   tests/train/grad_dtype.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_bf16 "$shared"

bf16g=(--set optim.grad_dtype=bf16)

run ref 2 --set parallel.zero=1
run g_z1 2 "${bf16g[@]}" --set parallel.zero=1
grep -q "bf16 gradients from fp32 buckets" "$tmp/g_z1.log" ||
  { echo "g_z1: the memory line does not name the bf16 gradients"; cat "$tmp/g_z1.log"; exit 1; }
# The tiny model's vocabulary outweighs its blocks: the buckets cost more than bf16 saves, and
# the start says so.
grep -q "note: optim.grad_dtype = \"bf16\" costs" "$tmp/g_z1.log" ||
  { echo "g_z1: no note that the buckets outweigh the saving"; cat "$tmp/g_z1.log"; exit 1; }
! cmp -s "$tmp/ref/model.safetensors" "$tmp/g_z1/model.safetensors" ||
  { echo "bf16 gradients end with the fp32 gradients' weights: the dtype did nothing"; exit 1; }
close g_z1 ref
for z in 0 2 3; do
  run "g_z$z" 2 "${bf16g[@]}" --set parallel.zero=$z
  same g_z1 "g_z$z" "ZeRO 1 against ZeRO $z"
done
run g_cut 2 "${bf16g[@]}" --set parallel.zero=1 --set train.stop_at=20
run g_cut 2 "${bf16g[@]}" --set parallel.zero=1 --resume auto
grep -q "resuming from .*step_00000020" "$tmp/g_cut.log" ||
  { echo "g_cut did not resume from step 20"; cat "$tmp/g_cut.log"; exit 1; }
same g_z1 g_cut "stop and resume"
mkdir -p "$tmp/tier"
run g_off 2 "${bf16g[@]}" --set parallel.zero=1 --set offload.dir="$tmp/tier" --set offload.chunk_mib=1
same g_z1 g_off "offload tier"

# Micro-batches of 2 rows: each rank accumulates two in its bf16 buffer before the sum.
for z in 1 2; do
  run "acc_ref_z$z" 2 --set parallel.zero=$z --set train.micro_batch_size=2
  run "acc_z$z" 2 "${bf16g[@]}" --set parallel.zero=$z --set train.micro_batch_size=2
  close "acc_z$z" "acc_ref_z$z"
done
run tp_ref 2 --set parallel.tp=2
run tp 2 "${bf16g[@]}" --set parallel.tp=2
close tp tp_ref
# Sequence parallelism: the LayerNorms' gradients are summed over the tp group, in fp32.
run tpsp_ref 2 --set parallel.tp=2 --set parallel.sp=true
run tpsp 2 "${bf16g[@]}" --set parallel.tp=2 --set parallel.sp=true
close tpsp tpsp_ref
run pp_ref 2 --set parallel.pp=2 --set train.micro_batch_size=2
run pp 2 "${bf16g[@]}" --set parallel.pp=2 --set train.micro_batch_size=2
close pp pp_ref
run f16_ref 2 --set train.precision=fp16
run f16 2 "${bf16g[@]}" --set train.precision=fp16
close f16 f16_ref

refused fp32_grads 1 "optim.grad_dtype" --set train.precision=fp32 --set optim.grad_dtype=bf16
refused lora_grads 1 "optim.grad_dtype" --set lora.rank=4 --set optim.grad_dtype=bf16
refused bad_grads 1 "optim.grad_dtype" --set optim.grad_dtype=fp8
