#!/usr/bin/env bash
# The offload tier through `keel train` ([offload] dir: AdamW's moments and a bf16 run's master
# in a scratch file, streamed through chunk buffers during the update):
#  1. offload must not change the math: with chunks small enough that the update streams through
#     many of them, runs end with the in-memory run's weights bitwise: bf16 at 2 ranks ZeRO 0
#     and 1, tp 2 and pp 2 (master and moments on the tier), ZeRO 3 with the weights' shard on
#     the tier ([offload] params, with and without a master, and fp16), bf16 moments without a
#     master, fp16, and fp32 (moments only);
#  2. a crash mid-update (SIGKILL after some chunks were written back) resumes from the last
#     checkpoint and ends with the uninterrupted run's weights;
#  3. a tier disk without room is one clear line and a failed start; the checkpoint already in
#     the run folder still verifies and resumes;
#  4. LoRA with offload is refused with one line, and so is the host tier ([offload] host, a
#     GPU's) on the CPU or beside a dir.
#   tests/train/offload.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
full=$tmp/full
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=30
        --set train.batch_size=8 --set optim.lr=3e-3 --set train.log_every=10
        --set train.precision=bf16 --set parallel.bucket_mb=0.05 --set checkpoint.every_minutes=0)
# 0.25 MiB chunks: the tiny model's 2 x 0.8 M-parameter state slices stream through 20-40 of them.
tier=(--set offload.dir="$tmp/tier" --set offload.chunk_mib=0.25)
source "$src/tests/train/run_lib.sh"

for z in 0 1; do
  run "mem_z$z" 2 --set parallel.zero=$z
  run "off_z$z" 2 --set parallel.zero=$z "${tier[@]}"
  grep -q "on the offload tier: .* MiB in $tmp/tier" "$tmp/off_z$z.log" ||
    { echo "off_z$z: no tier in the memory line"; cat "$tmp/off_z$z.log"; exit 1; }
  same "mem_z$z" "off_z$z" "bf16, ZeRO $z"
done
# ZeRO 3 with [offload] params: each rank's bf16 weight shard lives on the tier too, read into
# every segment's gather and rounded into by the update (with a master, and without one, where
# the shard is the master).
run mem_z3 2 --set parallel.zero=3
run off_z3 2 --set parallel.zero=3 "${tier[@]}" --set offload.params=true
grep -q "the weights' shard with it" "$tmp/off_z3.log" ||
  { echo "off_z3: the weights' shard is not on the tier"; cat "$tmp/off_z3.log"; exit 1; }
same mem_z3 off_z3 "bf16, ZeRO 3, the weights' shard on the tier"
nomaster=(--set optim.state_dtype=bf16 --set optim.master_weights=false --set parallel.zero=3)
run mem_z3_nomaster 2 "${nomaster[@]}"
run off_z3_nomaster 2 "${nomaster[@]}" "${tier[@]}" --set offload.params=true
same mem_z3_nomaster off_z3_nomaster "ZeRO 3 without a master, the weights' shard on the tier"
run mem_z3_fp16 2 --set parallel.zero=3 --set train.precision=fp16
run off_z3_fp16 2 --set parallel.zero=3 --set train.precision=fp16 "${tier[@]}" \
  --set offload.params=true
same mem_z3_fp16 off_z3_fp16 "fp16, ZeRO 3, the fp16 shard rounded into the tier's chunks"
refused params_z1 1 "offload.params.*is for parallel.zero = 3" "${tier[@]}" \
  --set offload.params=true --set parallel.zero=1
# Every rank of a tensor- or pipeline-parallel layout streams its own stage's or shard's state.
run mem_tp 2 --set parallel.tp=2
run off_tp 2 --set parallel.tp=2 "${tier[@]}"
same mem_tp off_tp "bf16, tp 2"
run mem_pp 2 --set parallel.pp=2 --set train.micro_batch_size=2
run off_pp 2 --set parallel.pp=2 --set train.micro_batch_size=2 "${tier[@]}"
same mem_pp off_pp "bf16, pp 2"
run mem_nomaster 1 --set optim.state_dtype=bf16 --set optim.master_weights=false
run off_nomaster 1 --set optim.state_dtype=bf16 --set optim.master_weights=false "${tier[@]}"
same mem_nomaster off_nomaster "bf16 moments, no master"
run mem_fp16 1 --set train.precision=fp16
run off_fp16 1 --set train.precision=fp16 "${tier[@]}"
same mem_fp16 off_fp16 "fp16 (master and moments offloaded, the fp16 copy rounded per chunk)"
run mem_fp32 1 --set train.precision=fp32
run off_fp32 1 --set train.precision=fp32 "${tier[@]}"
same mem_fp32 off_fp32 "fp32 (moments offloaded)"
[[ -z "$(ls -A "$tmp/tier")" ]] || { echo "the tier left files behind:"; ls -la "$tmp/tier"; exit 1; }

# A crash in the middle of step 25's update (after its 5th chunk was written back): the resumed
# run starts from step 20's checkpoint with a fresh tier and must end where the first one did.
rc=0
KEEL_OFFLOAD_CRASH_AT=25:5 OMP_NUM_THREADS=1 "$keel" train \
  "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=crash "${tier[@]}" \
  --set checkpoint.every_steps=10 >"$tmp/crash.log" 2>&1 || rc=$?
((rc != 0)) || { echo "crash: the run was not killed mid-update"; tail "$tmp/crash.log"; exit 1; }
[[ ! -e "$tmp/crash/model.safetensors" ]] || { echo "crash: the run finished"; exit 1; }
run crash 1 "${tier[@]}" --set checkpoint.every_steps=10 --resume auto
grep -q "resuming from .*step_00000020" "$tmp/crash.log" ||
  { echo "crash: did not resume from step 20"; cat "$tmp/crash.log"; exit 1; }
run mem_one 1 --set checkpoint.every_steps=10
same mem_one crash "a crash mid-update, resumed"

# No room on the tier's disk: a 1 MiB tmpfs for the run's 19 MiB of state.
mkdir -p "$full"
unshare -m bash -c "mount -t tmpfs -o size=1m tmpfs '$full' && OMP_NUM_THREADS=1 '$keel' train \
  '$src/configs/test-tiny.toml' ${common[*]} --set train.name=mem_one --set offload.dir='$full' \
  --set train.steps=40 --resume auto" >"$tmp/full.log" 2>&1 && rc=0 || rc=$?
((rc != 0)) || { echo "full: a run on a full tier disk succeeded"; cat "$tmp/full.log"; exit 1; }
grep -q "\[offload\] dir $full: no room for the optimizer state" "$tmp/full.log" ||
  { echo "full: no clear line"; cat "$tmp/full.log"; exit 1; }
echo "full: exit $rc: $(grep -m1 'no room' "$tmp/full.log")"
"$keel" ckpt verify "$tmp/mem_one/checkpoints/step_00000030" >/dev/null ||
  { echo "full: the committed checkpoint no longer verifies"; exit 1; }
run mem_one 1 --set checkpoint.every_steps=10 --set train.steps=40 --resume auto
grep -q "resuming from .*step_00000030" "$tmp/mem_one.log" ||
  { echo "full: the run did not resume from its checkpoint"; cat "$tmp/mem_one.log"; exit 1; }
echo "full: the checkpoint verifies and the run resumes from it"

refused lora_offload 1 "offload.dir" --set lora.rank=4 --set offload.dir="$tmp/tier"
refused host_on_cpu 1 "offload.host" --set offload.host=true
refused host_and_dir 1 "offload.host" --set offload.host=true --set offload.dir="$tmp/tier"
