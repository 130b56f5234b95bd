#!/usr/bin/env bash
# Issue 33's hang rows: a rank that hangs (KEEL_FAULT hang, for good) in each layout and phase
# (dp at ZeRO 0/1/3, the checkpoint phase, tp forward and backward, tp + sp, pp with either rank
# hanging, interleaved pp, tp 2 x pp 2 on 4 ranks)
# ends the job with exit 75 within [parallel] comm_timeout_s + 10 s, and the line names the group
# and the operation that waited (for a pipeline transfer, its stream and sequence number). Then the
# setup errors: the out folder a file on every rank, and on one rank only. A table of what ended
# each run, and when, goes to the test log.
#   tests/resilience/hang_matrix.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
# shellcheck source=../train/run_lib.sh
source "$src/tests/train/run_lib.sh"
tiny_4layer "$3"
timeout_s=4
common+=(--set parallel.comm_timeout_s=$timeout_s --set checkpoint.every_steps=3
         --set train.val_every=0)
rows=()

# hang NAME NP FAULT EXTRA...: the job must end with 75 in time, naming what waited (and, when
# `want` is set, with a line matching it).
hang() {
  local name=$1 np=$2 fault=$3
  shift 3
  local rc=0 t0 t1
  t0=$(date +%s.%N)
  KEEL_FAULT=$fault timeout 120 mpirun --oversubscribe --allow-run-as-root -np "$np" \
    -x OMP_NUM_THREADS=1 -x KEEL_FAULT "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" \
    --set train.name="$name" "$@" >"$tmp/$name.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  local took line
  took=$(printf '%.1f' "$(echo "$t1 - $t0" | bc)")
  line=$(grep -m1 -E "did not complete within|is stuck in|lost or hung" "$tmp/$name.log" || true)
  rows+=("$(printf '| %-28s | %s | %5s s | %s |' "$name ($fault)" "$rc" "$took" "${line:0:150}")")
  if ((rc != 75)); then
    echo "$name: exit $rc after $took s, expected 75"; tail -20 "$tmp/$name.log"; exit 1
  fi
  if (($(echo "$took > $timeout_s + 25" | bc))); then
    echo "$name: exit 75 after $took s, more than comm_timeout_s + 25"; exit 1
  fi
  [[ -n $line ]] || { echo "$name: no line names what waited"; cat "$tmp/$name.log"; exit 1; }
  if [[ -n ${want:-} ]] && ! grep -qE "$want" "$tmp/$name.log"; then
    echo "$name: no line matches '$want'"; cat "$tmp/$name.log"; exit 1
  fi
}

hang dp2-zero0-backward 2 "hang@2:1,phase=backward"
hang dp2-zero3-backward 2 "hang@2:1,phase=backward" --set parallel.zero=3
hang dp2-zero1-optimizer 2 "hang@2:1,phase=optimizer" --set parallel.zero=1
hang dp2-checkpoint 2 "hang@2:1,phase=checkpoint"
hang tp2-forward 2 "hang@2:1,phase=forward" --set parallel.tp=2
hang tp2-backward 2 "hang@2:1,phase=backward" --set parallel.tp=2
hang tp2-sp-backward 2 "hang@2:1,phase=backward" --set parallel.tp=2 --set parallel.sp=true
hang pp2-rank0 2 "hang@2:0,phase=backward" --set parallel.pp=2
# Stage 0 waits for stage 1's gradients: the line names the stream and the transfer's number in it.
want="receiving gradients \(pp#0 1->0 tag 11 RecvAsync #[0-9]+\)" \
  hang pp2-rank1 2 "hang@2:1,phase=forward" --set parallel.pp=2
hang pp2-interleaved 2 "hang@2:1,phase=backward" --set parallel.pp=2 \
  --set parallel.virtual_stages=2
hang tp2xpp2 4 "hang@2:3,phase=backward" --set parallel.tp=2 --set parallel.pp=2 \
  --set train.micro_batch_size=1

# Setup errors every rank hits (the out folder is a file) end the job within seconds, one line.
touch "$tmp/a-file"
rc=0
t0=$(date +%s)
timeout 60 mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "$keel" train \
  "$src/configs/test-tiny.toml" "${common[@]}" --set train.out_dir="$tmp/a-file" \
  >"$tmp/file.log" 2>&1 || rc=$?
took=$(($(date +%s) - t0))
((rc == 2)) || { echo "out_dir a file: exit $rc, expected 2"; cat "$tmp/file.log"; exit 1; }
(($(grep -c "keel: error" "$tmp/file.log") == 1)) ||
  { echo "out_dir a file: expected one error line"; cat "$tmp/file.log"; exit 1; }
((took < 20)) || { echo "out_dir a file: $took s"; exit 1; }
rows+=("$(printf '| %-28s | %s | %5s s | %s |' "out_dir a file (setup)" "$rc" "$took" "$(grep -m1 "keel: error" "$tmp/file.log")")")

# The same on one rank only: each rank runs in its own folder, where the relative out_dir is a
# folder for rank 0 and a file for rank 1. The lowest failing rank says so, once.
mkdir -p "$tmp/r0/runs" "$tmp/r1"
touch "$tmp/r1/runs"
rc=0
t0=$(date +%s)
one=("$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.out_dir=runs)
timeout 60 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -np 1 -wdir "$tmp/r0" \
  "${one[@]}" : -np 1 -wdir "$tmp/r1" "${one[@]}" >"$tmp/one.log" 2>&1 || rc=$?
took=$(($(date +%s) - t0))
((rc == 2)) || { echo "out_dir a file on rank 1: exit $rc, expected 2"; cat "$tmp/one.log"; exit 1; }
(($(grep -c "keel: error" "$tmp/one.log") == 1)) ||
  { echo "out_dir a file on rank 1: expected one error line"; cat "$tmp/one.log"; exit 1; }
grep -q "keel: error: rank 1 on " "$tmp/one.log" ||
  { echo "out_dir a file on rank 1: the line does not name rank 1"; cat "$tmp/one.log"; exit 1; }
((took < 20)) || { echo "out_dir a file on rank 1: $took s"; exit 1; }
# Rank 0 may have taken its run folder's lock (.keel.lock, naming it); it wrote nothing else.
[[ -z $(find "$tmp/r0/runs" -type f ! -name .keel.lock) ]] ||
  { echo "rank 0 wrote into its run folder:"; find "$tmp/r0/runs"; exit 1; }
rows+=("$(printf '| %-28s | %s | %5s s | %s |' "out_dir a file on rank 1" "$rc" "$took" "$(grep -m1 "keel: error" "$tmp/one.log")")")

printf '| %-28s | rc | took | the line |\n| --- | --- | --- | --- |\n' "layout (fault)"
printf '%s\n' "${rows[@]}"
