#!/usr/bin/env bash
# ZeRO stages against plain data parallel, in one invocation: GPT-2 124M, B=4 T=256 per rank, dp 2
# with one OpenMP thread per rank at ZeRO 0, 1, 2, 3, beside one process with 2 threads and the
# same global batch (B=8). Prints tokens/s (and the ratio to ZeRO-0 and to one process), the
# communication the step waited for, the bytes each rank sent per step beside the theoretical
# volume (2Ψ for the all-reduce of stages 0-2's gradients plus the stage's all-gather; 3Ψ at stage
# 3: two parameter gathers and one gradient reduce-scatter, in the ring model's (dp-1)/dp), and
# the model-state bytes per rank.
#
#   bench/zero_throughput.sh                  # gpt2 bf16, STEPS=5 WARMUP=2
#   MODEL=gpt2-mini DTYPE=fp32 STEPS=3 bench/zero_throughput.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
model=${MODEL:-gpt2} dtype=${DTYPE:-bf16} steps=${STEPS:-5} warmup=${WARMUP:-2}
out=$build/zero_throughput.jsonl
: >"$out"
echo "zero_throughput: $model $dtype, B=4 T=256 per rank, $steps timed steps ($(nproc) cores)"
OMP_NUM_THREADS=2 "$build/bench_train_step" "$model" 8 256 "$dtype" "$steps" "$warmup" none 0 >>"$out"
for z in 0 1 2 3; do
  mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 \
    "$build/bench_train_step" "$model" 4 256 "$dtype" "$steps" "$warmup" none "$z" >>"$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
one, dp = rows[0], rows[1:]
z0 = dp[0]["tokens_per_s"]
psi = one["params"]
elem = 2 if one["dtype"] == "bf16" else 4
print(f"{'run':22s} {'tokens/s':>9s} {'/zero0':>7s} {'/1proc':>7s} {'wait ms':>8s} "
      f"{'sent MB':>8s} {'theory MB':>9s} {'state MB/rank':>13s}")
print(f"{'1 process x 2 threads':22s} {one['tokens_per_s']:9.0f} {'':>7s} {'1.00':>7s} {'-':>8s} "
      f"{'-':>8s} {'-':>9s} {sum(v for k, v in one['memory_bytes'].items() if k != 'activations')/1e6:13.1f}")
for r in dp:
    z, n = r["zero"], r["dp"]
    ring = (n - 1) / n
    # Gradients in fp32: all-reduce 2x4Ψ (stages 0-1) or reduce-scatter 4Ψ (2-3); weights: an
    # all-gather of the working dtype after the update (1-2), or two per step (3: forward and
    # backward); bf16 biases add a negligible all-reduce.
    grads = (2 if z < 2 else 1) * 4 * psi
    params = {0: 0, 1: 1, 2: 1, 3: 2}[z] * elem * psi
    theory = ring * (grads + params)
    state = sum(v for k, v in r["memory_bytes"].items() if k != "activations")
    print(f"{'dp 2 x 1 thread, zero ' + str(z):22s} {r['tokens_per_s']:9.0f} "
          f"{r['tokens_per_s']/z0:7.2f} {r['tokens_per_s']/one['tokens_per_s']:7.2f} "
          f"{r['comm_wait_ms']:8.1f} {r['comm_bytes']/1e6:8.1f} {theory/1e6:9.1f} {state/1e6:13.1f}")
PY
