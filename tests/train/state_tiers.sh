#!/usr/bin/env bash
# The smaller optimizer-state tiers through `keel train` (bf16 runs): optim.state_dtype = "bf16"
# (AdamW's moments in bf16, stochastically rounded) and optim.master_weights = false (no fp32
# master). For each tier:
#  1. a stop at step 20 and --resume auto to 40 give the uninterrupted run's weights bitwise
#     (checkpoints hold the bf16 state widened; loading rounds it back exactly), at 2 ranks ZeRO 1;
#  2. the stochastic rounding's draws follow the element, not the layout: 2 ranks at ZeRO 0, 1
#     and 3 end with bitwise-equal weights;
#  3. at tp 2 (whole tensors on both ranks draw alike) a stop and resume is bitwise too;
#  4. the loss stays within 3% of the fp32-state run's after 40 steps.
# And: master_weights = false with fp32 or with LoRA is refused with one line.
#   tests/train/state_tiers.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_bf16 "$shared"

final_loss() { tail -n 1 "$tmp/$1/metrics.jsonl" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])'; }

run ref 2 --set parallel.zero=1
declare -A tiers=([moments]="--set optim.state_dtype=bf16"
                  [nomaster]="--set optim.state_dtype=bf16 --set optim.master_weights=false")
for t in moments nomaster; do
  read -ra flags <<<"${tiers[$t]}"
  run "${t}_z1" 2 "${flags[@]}" --set parallel.zero=1
  run "${t}_cut" 2 "${flags[@]}" --set parallel.zero=1 --set train.stop_at=20
  run "${t}_cut" 2 "${flags[@]}" --set parallel.zero=1 --resume auto
  grep -q "resuming from .*step_00000020" "$tmp/${t}_cut.log" ||
    { echo "${t}_cut did not resume from step 20"; cat "$tmp/${t}_cut.log"; exit 1; }
  same "${t}_z1" "${t}_cut" "$t: stop and resume"
  ! cmp -s "$tmp/ref/model.safetensors" "$tmp/${t}_z1/model.safetensors" ||
    { echo "$t: the same weights as the fp32 state's run: the tier did nothing"; exit 1; }
  for z in 0 3; do
    run "${t}_z$z" 2 "${flags[@]}" --set parallel.zero=$z
    same "${t}_z1" "${t}_z$z" "$t: ZeRO 1 against ZeRO $z"
  done
  # Tensor parallel: a tensor both ranks hold whole (LayerNorms) must draw alike on both, or the
  # copies drift and a resume (which re-syncs them) is not the uninterrupted run.
  run "${t}_tp" 2 "${flags[@]}" --set parallel.tp=2
  run "${t}_tpcut" 2 "${flags[@]}" --set parallel.tp=2 --set train.stop_at=20
  run "${t}_tpcut" 2 "${flags[@]}" --set parallel.tp=2 --resume auto
  same "${t}_tp" "${t}_tpcut" "$t: tp 2 stop and resume"
  /usr/bin/python3 - "$t" "$(final_loss ref)" "$(final_loss "${t}_z1")" <<'PY'
import sys
name, ref, got = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rel = abs(got - ref) / ref
print(f"{name}: loss at step 40 {got:.4f}, fp32 state {ref:.4f} ({100 * rel:.2f}%, limit 3%)")
sys.exit(rel > 0.03)
PY
done

refused fp32_nomaster 1 "optim.master_weights" --set train.precision=fp32 \
  --set optim.master_weights=false
refused lora_nomaster 1 "optim.master_weights" --set lora.rank=4 --set optim.master_weights=false
refused bad_dtype 1 "optim.state_dtype" --set optim.state_dtype=fp8
