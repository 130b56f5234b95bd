#!/usr/bin/env bash
# Ranks that would run different things do not start, and a rank's setup error reaches the job:
# launched with mpirun's per-rank command lines (`-np 1 A : -np 1 B`),
#   - another optim.lr, another data.train (same size, other tokens), another model.n_layer on
#     rank 1: exit 2 before any step, one line naming the key and both values;
#   - a missing data.train on rank 1: exit 2 (not 75 after a timeout), its message printed once;
#   - the same model.init_from path with other contents on rank 1: exit 2 naming the key;
#   - an unknown key on every rank: one error line for the job; keel eval with a model only
#     rank 0 can read: exit 2 at once, one line naming rank 1;
#   - the same command on both ranks trains (the control);
#   - ranks on different CPU generations (here rank 1 held to x86-64-v2 by KEEL_CPU_ISA) all run
#     the narrowest kernels any of them has, and rank 0 names them.
#   tests/train/rank_agreement.sh KEEL_BINARY SOURCE_DIR SHARED_DATA
set -euo pipefail
keel=$1 src=$2 shared=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 200000 "$shared/brown/brown.gpt2.u16" >"$tmp/a.u16"
head -c 400000 "$shared/brown/brown.gpt2.u16" | tail -c 200000 >"$tmp/b.u16"
base=("$keel" train "$src/configs/test-tiny.toml" --set train.out_dir="$tmp" --set train.steps=2
      --set parallel.comm_timeout_s=30)

# two NAME EXPECTED-RC EXPECTED-TEXT RANK0-ARGS... -- RANK1-ARGS...
two() {
  local name=$1 want_rc=$2 want=$3
  shift 3
  local a=() b=()
  while (($#)) && [[ $1 != -- ]]; do a+=("$1"); shift; done
  shift
  b=("$@")
  local rc=0
  timeout 120 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 \
    -np 1 "${base[@]}" --set train.name="$name" "${a[@]}" : \
    -np 1 "${base[@]}" --set train.name="$name" "${b[@]}" >"$tmp/$name.log" 2>&1 || rc=$?
  ((rc == want_rc)) || { echo "$name: exit $rc, expected $want_rc"; cat "$tmp/$name.log"; exit 1; }
  if [[ -n $want ]]; then
    local n
    n=$(grep -c -F -- "$want" "$tmp/$name.log" || true)
    ((n == 1)) || { echo "$name: \"$want\" appears $n times, expected once"; cat "$tmp/$name.log"; exit 1; }
    echo "$name: exit $rc: $(grep -F -- "$want" "$tmp/$name.log")"
  fi
}

two same 0 "" --set data.train="$tmp/a.u16" -- --set data.train="$tmp/a.u16"
grep -q "step     2/2" "$tmp/same.log" || { echo "same: did not train"; cat "$tmp/same.log"; exit 1; }
rc=0
timeout 120 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 \
  -np 1 "${base[@]}" --set train.name=isa --set data.train="$tmp/a.u16" : \
  -np 1 env KEEL_CPU_ISA=x86-64-v2 "${base[@]}" --set train.name=isa --set data.train="$tmp/a.u16" \
  >"$tmp/isa.log" 2>&1 || rc=$?
((rc == 0)) && grep -q "; kernels: x86-64-v2" "$tmp/isa.log" ||
  { echo "isa: exit $rc, expected 0 and rank 0 on x86-64-v2 kernels"; cat "$tmp/isa.log"; exit 1; }
echo "isa: $(grep -o "kernels: [a-z0-9-]*" "$tmp/isa.log")"
two lr 2 "the ranks disagree on optim.lr: rank 1 has 0.01, rank 0 has 6e-04" \
  --set data.train="$tmp/a.u16" -- --set data.train="$tmp/a.u16" --set optim.lr=1e-2
two data 2 "the ranks disagree on data.train: rank 1 has 200000 bytes, xxh3" \
  --set data.train="$tmp/a.u16" -- --set data.train="$tmp/b.u16"
two layers 2 "the ranks disagree on model.n_layer: rank 1 has 3, rank 0 has 0 (from gpt2-tiny: 2)" \
  --set data.train="$tmp/a.u16" -- --set data.train="$tmp/a.u16" --set model.n_layer=3
two missing 2 "rank 1 on $(hostname): $tmp/nowhere.u16: not found" \
  --set data.train="$tmp/a.u16" -- --set data.train="$tmp/nowhere.u16"
# The same model.init_from path with other contents on rank 1 (each rank in its own folder, the
# path relative): refused, naming the key, before any step.
mkdir -p "$tmp/r0" "$tmp/r1"
cp "$tmp/same/model.safetensors" "$tmp/r0/init.safetensors"
cp "$tmp/same/model.safetensors" "$tmp/r1/init.safetensors"
/usr/bin/python3 -c "
import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[-4] ^= 0x01
open(p, 'wb').write(bytes(b))" "$tmp/r1/init.safetensors"
rc=0
timeout 120 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 \
  -np 1 -wdir "$tmp/r0" "${base[@]}" --set train.name=init --set data.train="$tmp/a.u16" \
  --set model.init_from=init.safetensors : \
  -np 1 -wdir "$tmp/r1" "${base[@]}" --set train.name=init --set data.train="$tmp/a.u16" \
  --set model.init_from=init.safetensors >"$tmp/init.log" 2>&1 || rc=$?
want="the ranks disagree on model.init_from: rank 1 has"
((rc == 2)) && (($(grep -c -F -- "$want" "$tmp/init.log") == 1)) ||
  { echo "init: exit $rc, expected 2 and one \"$want\""; cat "$tmp/init.log"; exit 1; }
echo "init: exit 2: $(grep -F -- "$want" "$tmp/init.log")"
# An error every rank hits (an unknown key) is said once for the job, not once per rank.
rc=0
timeout 60 mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "${base[@]}" \
  --set train.name=typo --set train.stepz=3 >"$tmp/typo.log" 2>&1 || rc=$?
((rc == 2)) && (($(grep -c "keel: error" "$tmp/typo.log") == 1)) ||
  { echo "typo: exit $rc, expected 2 and one error line"; cat "$tmp/typo.log"; exit 1; }
echo "typo: exit 2: $(grep "keel: error" "$tmp/typo.log")"
# keel eval on 2 ranks where rank 1 cannot read the model: exit 2 at once, said once (it waited
# in the first collective for good).
rc=0
timeout 60 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 \
  -np 1 "$keel" eval "$tmp/r0/init.safetensors" --data "$tmp/a.u16" --max-tokens 2000 : \
  -np 1 "$keel" eval "$tmp/nowhere.safetensors" --data "$tmp/a.u16" --max-tokens 2000 \
  >"$tmp/eval.log" 2>&1 || rc=$?
((rc == 2)) && (($(grep -c "keel: error: rank 1 on $(hostname): " "$tmp/eval.log") == 1)) ||
  { echo "eval: exit $rc, expected 2 and one \"rank 1\" line"; cat "$tmp/eval.log"; exit 1; }
echo "eval: exit 2: $(grep "keel: error" "$tmp/eval.log")"
for n in lr data layers missing init; do
  if ls "$tmp/$n" >/dev/null 2>&1; then echo "$n: the run folder was created"; exit 1; fi
done
echo "rank agreement: ok"
