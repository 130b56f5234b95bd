#!/usr/bin/env bash
# Issue 33: the ranks choose the resume checkpoint together. A sharded run (dp 2 ZeRO 3; tp 2 x
# pp 2 on 4 ranks) saves at steps 5 and 10 and stops at 14; then one rank's piece of step 10 is
# damaged (a flipped byte, a truncation, a deletion; each rank's in turn) and `--resume auto` must
# resume step 5 on every rank, finish, and end with exactly the final loss of a run resumed from
# step 5 directly. Before, the rank whose piece failed went back to step 5 alone and the job hung.
#   tests/resilience/sharded_fallback.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
# shellcheck source=../train/run_lib.sh
source "$src/tests/train/run_lib.sh"
tiny_4layer "$3"
common+=(--set checkpoint.every_steps=5 --set checkpoint.at_end=false
         --set checkpoint.keep_last=5 --set parallel.comm_timeout_s=20 --set train.val_every=0)
final_loss() { tail -1 "$tmp/$1/metrics.jsonl" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['loss'])"; }
declare -A done_to=([flip]="had a byte flipped" [truncate]="truncated" [delete]="deleted")

# series LAYOUT NP "DAMAGE:RANK..." EXTRA...: the run, the reference resumed from step 5, and one
# resume per damage.
series() {
  local layout=$1 np=$2 damages=$3
  shift 3
  run "$layout" "$np" --set train.stop_at=14 "$@"
  [[ -d $tmp/$layout/checkpoints/step_00000010 ]] ||
    { echo "$layout: no step 10 checkpoint"; ls "$tmp/$layout/checkpoints"; exit 1; }
  # The reference: step 10 gone, resumed from step 5.
  cp -r "$tmp/$layout" "$tmp/$layout-ref"
  rm -rf "$tmp/$layout-ref/checkpoints/step_00000010"
  echo step_00000005 >"$tmp/$layout-ref/checkpoints/latest"
  run "$layout-ref" "$np" --set checkpoint.resume=auto "$@"
  local want
  want=$(final_loss "$layout-ref")
  for damage in $damages; do
    local what=${damage%:*} rank=${damage#*:}
    local name=$layout-$what$rank
    cp -r "$tmp/$layout" "$tmp/$name"
    local piece=$tmp/$name/checkpoints/step_00000010/rank_0000$rank.bin
    [[ -f $piece ]] || { echo "no $piece"; ls "$(dirname "$piece")"; exit 1; }
    case $what in
      flip) /usr/bin/python3 -c "
import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0x10
open(p, 'wb').write(bytes(b))" "$piece" ;;
      truncate) truncate -s 100 "$piece" ;;
      delete) rm "$piece" ;;
    esac
    timeout 300 bash -c "$(declare -f run); $(declare -p keel src tmp common); run $name $np --set checkpoint.resume=auto $(printf '%q ' "$@")" ||
      { echo "$name: the resume did not finish"; tail -20 "$tmp/$name.log"; exit 1; }
    grep -q "resuming from $tmp/$name/checkpoints/step_00000005" "$tmp/$name.log" ||
      { echo "$name: did not resume step 5"; cat "$tmp/$name.log"; exit 1; }
    grep -q "skipping checkpoint $tmp/$name/checkpoints/step_00000010: rank $rank:" "$tmp/$name.log" ||
      { echo "$name: the rank that refused step 10 did not say why"; cat "$tmp/$name.log"; exit 1; }
    local got
    got=$(final_loss "$name")
    [[ $got == "$want" ]] || { echo "$name: final loss $got, the run resumed from step 5 directly: $want"; exit 1; }
    echo "$name: step 10's rank $rank piece ${done_to[$what]}: resumed step 5 on all $np ranks, final loss $got (= $want)"
  done
}

series dp2-zero3 2 "flip:0 truncate:1 delete:0 flip:1" --set parallel.zero=3
series tp2xpp2 4 "flip:0 truncate:1 delete:2 flip:3" --set parallel.tp=2 --set parallel.pp=2 \
  --set train.micro_batch_size=1
