#!/usr/bin/env bash
# Data parallel gives the single-process loss curve: `mpirun -np N keel train` against one
# process with the same global batch, 20 steps in fp32; every step's loss must agree to 1e-5
# relative. Also with gradient accumulation (2 micro-batches per rank).
#   tests/train/dp_equivalence.sh KEEL_BINARY SOURCE_DIR SHARED_DATA NP
set -euo pipefail
keel=$1 src=$2 shared=$3 np=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 "$shared/brown/brown.gpt2.u16" >"$tmp/tokens.u16"
common=(--set data.train="$tmp/tokens.u16" --set train.out_dir="$tmp" --set train.steps=20
        --set train.batch_size=$((4 * np)) --set optim.lr=3e-3 --set parallel.bucket_mb=0.05)

OMP_NUM_THREADS=1 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" \
  --set train.name=single >"$tmp/single.log" 2>&1 || { cat "$tmp/single.log"; exit 1; }
mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS=1 \
  "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=dp \
  >"$tmp/dp.log" 2>&1 || { cat "$tmp/dp.log"; exit 1; }
mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS=1 \
  "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=accum \
  --set train.micro_batch_size=2 >"$tmp/accum.log" 2>&1 || { cat "$tmp/accum.log"; exit 1; }

/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl")]
ref = losses("single")
assert len(ref) == 20, f"single run has {len(ref)} steps, expected 20"
bad = 0
for name in ("dp", "accum"):
    got = losses(name)
    assert len(got) == 20, f"{name} run has {len(got)} steps, expected 20"
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"{name}: max relative loss difference over 20 steps {worst:.2e} (limit 1e-5)")
    if worst > 1e-5:
        bad = 1
        for i, (a, b) in enumerate(zip(got, ref)):
            print(f"  step {i+1}: {name} {a:.8f} single {b:.8f}")
print(f"first/last loss: {ref[0]:.4f} {ref[-1]:.4f}")
sys.exit(bad)
PY
