#!/usr/bin/env bash
# Tensor, sequence and pipeline parallelism against data parallelism and one process, in one
# invocation: GPT-2 124M, T=256, a global batch of 8 sequences in micro-batches of 1 (m = 8 per
# pipeline, 4 per rank at dp 2), one OpenMP thread per rank. Runs 1 process x 2 threads, then with
# 2 ranks dp 2, tp 2, tp 2 + sp, pp 2 (1F1B; also interleaved with 2 chunks per rank, and split
# 9 + 3 by pp_layers=auto), and with 4 ranks oversubscribed on the cores (say so when reading the
# figures) pp 4, dp 2 x pp 2 and tp 2 x pp 2. Prints tokens/s (and the ratio to one process), the
# communication each group made the step wait for (dp, tp, pp: the slowest rank's), the bubble
# the last stage measured beside the planner's (p-1)/(m+p-1)/v, and the planner's step time
# (`keel plan --accelerator this-cpu --accounting keel`, timing keel's kernels with one thread,
# which is what each rank has) beside the measured one.
#
#   bench/parallel_throughput.sh                  # gpt2 bf16, STEPS=3 WARMUP=1
#   MODEL=gpt2-mini DTYPE=fp32 bench/parallel_throughput.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
model=${MODEL:-gpt2} dtype=${DTYPE:-bf16} steps=${STEPS:-3} warmup=${WARMUP:-1}
out=$build/parallel_throughput.jsonl
: >"$out"
echo "parallel_throughput: $model $dtype, T=256, 8 sequences per step, $steps timed steps ($(nproc) cores)"
bench() {  # np threads B zero micro_batches pp [virtual_stages] [equal|auto] [tp] [sp]
  local np=$1 threads=$2
  shift 2
  local cmd=("$build/bench_train_step" "$model" "$1" 256 "$dtype" "$steps" "$warmup" none "${@:2}")
  if ((np == 1)); then
    OMP_NUM_THREADS=$threads "${cmd[@]}" >>"$out"
  else
    mpirun --oversubscribe --allow-run-as-root -np "$np" -x OMP_NUM_THREADS="$threads" "${cmd[@]}" \
      >>"$out"
  fi
}
bench 1 2 1 0 8 1   # one process, 8 micro-batches
bench 2 1 1 0 4 1   # dp 2
bench 2 1 1 0 8 1 1 equal 2 0  # tp 2
bench 2 1 1 0 8 1 1 equal 2 1  # tp 2 + sp
bench 2 1 1 0 8 2   # pp 2
bench 2 1 1 0 8 2 2 # pp 2, interleaved: 2 chunks of 3 layers per rank
bench 2 1 1 0 8 2 1 auto  # pp 2, 9 + 3 layers: the classifier's stage gets fewer
bench 4 1 1 0 8 4   # pp 4 (4 ranks on the cores)
bench 4 1 1 0 4 2   # dp 2 x pp 2 (4 ranks on the cores)
bench 4 1 1 0 8 2 1 equal 2 0  # tp 2 x pp 2 (4 ranks on the cores)
/usr/bin/python3 - "$out" "$build/keel" "$model" "$dtype" <<'PY'
import json, os, subprocess, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keel, model, dtype = sys.argv[2:5]
def planned(r):
    n = r["dp"] * r["pp"] * r["tp"]
    cmd = [keel, "plan", "--model", model, "--seq", "256", "--global-batch", "8",
           "--accelerator", "this-cpu", "--accelerators", str(n), "--per-node", str(n),
           "--tp", str(r["tp"]), "--pp", str(r["pp"]), "--dp", str(r["dp"]), "--zero", str(r["zero"]),
           "--micro-batch", "1", "--recompute", "none", "--sp", "on" if r["sp"] else "off", "--precision", dtype,
           "--virtual-stages", str(r.get("virtual_stages", 1)), "--accounting", "keel", "--json"]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # this-cpu as one rank sees it: one thread
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                  env=env).stdout)
    return j["layouts"][0] if j["layouts"] else None
one = rows[0]["tokens_per_s"]
print(f"{'run':30s} {'tokens/s':>9s} {'/1proc':>7s} {'dp wait':>8s} {'tp wait':>8s} "
      f"{'pp wait':>8s} {'bubble':>7s} {'planned':>8s} {'step s':>7s} {'plan s':>7s}")
for r in rows:
    v = r.get("virtual_stages", 1)
    split = ", pp_layers=auto" if r.get("pp_layers") == "auto" else ""
    n = r["dp"] * r["pp"] * r["tp"]
    parts = [f"{k} {r[k]}" for k in ("dp", "tp", "pp") if r[k] > 1]
    name = ("1 process x 2 threads" if n == 1 else
            " x ".join(parts) + (" + sp" if r["sp"] else "") +
            (f" v {v}" if v > 1 else "") + f", m {r['micro_batches']}{split}")
    # The planner splits the layers equally: no figure for the balanced split.
    p = planned(r) if n > 1 and r.get("pp_layers") != "auto" else None
    pb = f"{p['bubble']:.3f}" if p else "-"
    ps = f"{p['step_s']:.2f}" if p else "-"
    bubble = f"{r['bubble']:.3f}" if r["pp"] > 1 else "-"
    print(f"{name:30s} {r['tokens_per_s']:9.0f} {r['tokens_per_s']/one:7.2f} "
          f"{r['dp_wait_ms']:8.0f} {r['tp_wait_ms']:8.0f} {r['pp_wait_max_ms']:8.0f} {bubble:>7s} "
          f"{pb:>8s} {r['ms_per_step']/1e3:7.2f} {ps:>7s}")
PY
