# The layout tests' way of running keel train, sourced after setting `keel`, `src`, `tmp` and the
# `common` array of --set flags (or `tiny_4layer SHARED` for the pipeline and tensor tests'):
#   tiny_4layer SHARED              training and validation tokens from the shared Brown corpus
#                                   in $tmp, and `common` for a 4-layer tiny GPT: 20 steps, global
#                                   batch 8 in micro-batches of 2, validation every 10 steps
#   tiny_bf16 SHARED                training tokens in $tmp and `common` for the 2-layer tiny GPT
#                                   in bf16: 40 steps of global batch 8 (the state tiers' tests)
#   run NAME NP EXTRA...            trains $src/configs/test-tiny.toml as $tmp/NAME (mpirun when
#                                   NP > 1); on failure prints the log and exits 1
#   refused NAME NP TEXT EXTRA...   expects exit 2 and TEXT in the output (one line naming it)
#   same NAME_A NAME_B WHAT         expects the two runs' final weights bitwise equal
#   close NAME REF                  expects every one of the 40 steps' loss within 0.5% of REF's

run() {
  local name=$1 np=$2
  shift 2
  local cmd=("$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name="$name" "$@")
  if ((np > 1)); then
    cmd=(mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS=1 "${cmd[@]}")
  fi
  OMP_NUM_THREADS=1 "${cmd[@]}" >>"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}

refused() {
  local name=$1 np=$2 want=$3
  shift 3
  local rc=0
  mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS=1 "$keel" train \
    "$src/configs/test-tiny.toml" "${common[@]}" --set train.name="$name" "$@" \
    >"$tmp/$name.log" 2>&1 || rc=$?
  grep -q -- "$want" "$tmp/$name.log" || { echo "$name: no \"$want\":"; cat "$tmp/$name.log"; exit 1; }
  ((rc == 2)) || { echo "$name: exit $rc, expected 2"; cat "$tmp/$name.log"; exit 1; }
  echo "$name: refused with exit 2: $(grep -m1 -- "$want" "$tmp/$name.log")"
}

same() {  # same NAME_A NAME_B WHAT
  cmp -s "$tmp/$1/model.safetensors" "$tmp/$2/model.safetensors" ||
    { echo "$3: $1 and $2 end with different weights"; exit 1; }
  echo "$3: $1 = $2, bitwise"
}

close() {
  /usr/bin/python3 - "$1" "$2" "$tmp/$2/metrics.jsonl" "$tmp/$1/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return {d["step"]: d["loss"] for d in map(json.loads, open(path)) if "loss" in d and "step" in d}
name, ref_name, ref, got = sys.argv[1], sys.argv[2], losses(sys.argv[3]), losses(sys.argv[4])
assert len(ref) == 40 and ref.keys() == got.keys(), (sorted(ref), sorted(got))
rel = max(abs(got[s] - ref[s]) / ref[s] for s in ref)
print(f"{name}: loss at step 40 {got[40]:.4f}, {ref_name} {ref[40]:.4f}; "
      f"largest step difference {100 * rel:.3f}% (limit 0.5%)")
sys.exit(rel > 0.005)
PY
}

tiny_4layer() {
  head -c 400000 "$1/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
  head -c 500000 "$1/brown/brown.gpt2.u16" | tail -c 100000 >"$tmp/val.u16"
  common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=20
          --set data.val="$tmp/val.u16" --set train.val_every=10 --set train.val_batches=2
          --set train.batch_size=8 --set train.micro_batch_size=2 --set model.n_layer=4
          --set optim.lr=3e-3 --set parallel.bucket_mb=0.05 --set checkpoint.every_minutes=0)
}

tiny_bf16() {
  head -c 400000 "$1/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
  common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=40
          --set train.batch_size=8 --set optim.lr=3e-3 --set train.log_every=10
          --set train.precision=bf16 --set parallel.bucket_mb=0.05 --set checkpoint.every_minutes=0)
}
