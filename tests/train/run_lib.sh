# The layout tests' way of running keel train, sourced after setting `keel`, `src`, `tmp` and the
# `common` array of --set flags:
#   run NAME NP EXTRA...            trains $src/configs/test-tiny.toml as $tmp/NAME (mpirun when
#                                   NP > 1); on failure prints the log and exits 1
#   refused NAME NP TEXT EXTRA...   expects exit 2 and TEXT in the output (one line naming it)

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
