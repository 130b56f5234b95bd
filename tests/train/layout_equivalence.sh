#!/usr/bin/env bash
# Layout equivalence: every data-parallel size and ZeRO stage gives the single-process loss curve.
# dp in {1, 2, 4} x zero in {0, 1, 2, 3}, 20 steps of the tiny GPT at the same global batch:
#   fp32: every step's loss within 1e-5 relative of one process, also with 2 micro-batches;
#   bf16: within 1e-2 relative of one bf16 process.
#   tests/train/layout_equivalence.sh KEEL_BINARY SOURCE_DIR SHARED_DATA [DPS] [ZEROS]
set -euo pipefail
keel=$1 src=$2 shared=$3 dps=${4:-"1 2 4"} zeros=${5:-"0 1 2 3"} kinds=${6:-"fp32 accum bf16"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=20
        --set train.batch_size=8 --set optim.lr=3e-3 --set parallel.bucket_mb=0.05)

run() {  # name np extra...
  local name=$1 np=$2
  shift 2
  local cmd=("$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name="$name" "$@")
  if ((np == 1)); then
    OMP_NUM_THREADS=1 "${cmd[@]}" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
  else
    mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS=1 "${cmd[@]}" \
      >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
  fi
}

declare -A extra=([fp32]="" [accum]="--set train.micro_batch_size=2"
                   [bf16]="--set train.precision=bf16")
run ref-fp32 1
[[ $kinds == *bf16* ]] && run ref-bf16 1 --set train.precision=bf16
names=()
for dp in $dps; do
  for z in $zeros; do
    for k in $kinds; do
      # shellcheck disable=SC2086  # the extra flags are words
      run "$k-dp$dp-z$z" "$dp" --set parallel.zero="$z" ${extra[$k]}
      names+=("$k-dp$dp-z$z")
    done
  done
done

/usr/bin/python3 - "$tmp" "${names[@]}" <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl")]
refs = {"fp32": losses("ref-fp32")}
if any(n.startswith("bf16") for n in names):
    refs["bf16"] = losses("ref-bf16")
bad = 0
for name in names:
    kind = "bf16" if name.startswith("bf16") else "fp32"
    limit = 1e-2 if kind == "bf16" else 1e-5
    ref, got = refs[kind], losses(name)
    if len(got) != 20:
        print(f"{name}: {len(got)} steps, expected 20"); bad = 1; continue
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    ok = worst <= limit
    print(f"{name:16s} max relative loss difference {worst:.2e} (limit {limit:g}) {'ok' if ok else 'FAIL'}")
    if not ok:
        bad = 1
        for i, (a, b) in enumerate(zip(got, ref)):
            print(f"  step {i+1}: {a:.8f} reference {b:.8f}")
r = refs["fp32"]
print(f"fp32 reference first/last loss: {r[0]:.4f} {r[-1]:.4f}")
sys.exit(bad)
PY
