#!/usr/bin/env bash
# Context parallelism (parallel.cp) on long sequences, one invocation: a GPT-2 shape (gpt2-mini:
# 4 layers, 4 heads, 256 wide; its learned positions grown to the sequence) at B=1, bf16, full
# steps, every rank on ONE thread so that cp 1 (one core) is the peer of cp 2 (two cores), and
# cp 4 runs 4 ranks on the machine's cores (2 here: oversubscribed 2x, stated in the table).
# Per run: tokens/s, the step, this rank's attention time (forward + backward kernels and, under
# cp, the block bookkeeping), the exposed cp communication, the keys' and values' MB, the
# activation arena and the peak RSS per rank; then the attention's scaling from cp 1:
#   efficiency = attention(cp 1) / (cp x attention(cp)) x (cp / cores, where cp > cores),
# i.e. against the core-seconds the ranks had. Last: the ring against the all-gather, and the
# memory check's verdict on a llama-120m at 128k tokens by cp (keel plan, keel's exact arena).
#
#   bench/context_parallel.sh                      # LENS="8192 16384 32768" CPS="1 2 4"
#   LENS=4096 CPS="1 2" COMPARE="" bench/context_parallel.sh  # smoke
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
model=${MODEL:-gpt2-mini}
lens=${LENS:-8192 16384 32768}
cps=${CPS:-1 2 4}
compare=${COMPARE-4096 32768}  # COMPARE="" skips the ring vs all-gather runs
out=$build/context_parallel.jsonl
: >"$out"
cores=$(nproc)
declare -A ran
run() {  # T CP COMM (once each)
  local t=$1 cp=$2 comm=$3 warmup=1
  [[ -n ${ran[$t:$cp:$comm]:-} ]] && return
  ran[$t:$cp:$comm]=1
  ((t >= 16384)) && warmup=0  # a 32k step is a minute and a half on one core
  local cmd=("$build/bench_train_step" "$model" 1 "$t" bf16 1 "$warmup" none 0 1 1 1 equal 1 0
             "$cp" "$comm")
  ((cp > 1)) && cmd=(mpirun --oversubscribe --allow-run-as-root -np "$cp" -x OMP_NUM_THREADS=1
                     "${cmd[@]}")
  echo "T=$t cp=$cp $comm ..." >&2
  OMP_NUM_THREADS=1 "${cmd[@]}" >>"$out"
}
for t in $lens; do
  for cp in $cps; do run "$t" "$cp" ring; done
done
for t in $compare; do
  for cp in $cps; do
    ((cp > 1)) || continue
    run "$t" "$cp" ring
    run "$t" "$cp" allgather
  done
  run "$t" 1 ring
done
/usr/bin/python3 - "$out" "$cores" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cores = int(sys.argv[2])
def attn(r):
    b = r["breakdown_ms"]
    return b.get("attention_fwd", 0) + b.get("attention_bwd", 0)
one = {r["T"]: r for r in rows if r["cp"] == 1}
print(f"{'T':>6s} {'cp':>3s} {'comm':>9s} {'tokens/s':>9s} {'step s':>7s} {'attn s':>7s} "
      f"{'cp wait':>8s} {'cp MB':>7s} {'arena MiB':>9s} {'RSS MiB':>8s} {'attn eff':>8s}")
for r in sorted(rows, key=lambda r: (r["cp_comm"] != "ring", r["T"], r["cp"])):
    base = one.get(r["T"])
    eff = "-"
    if base and r["cp"] > 1:
        share = max(1.0, r["cp"] / cores)  # oversubscribed ranks share the cores
        eff = f"{attn(base) / (r['cp'] * attn(r)) * share:.2f}"
        if r["cp"] > cores:
            eff += "*"
    print(f"{r['T']:6d} {r['cp']:3d} {r['cp_comm']:>9s} {r['tokens_per_s']:9.0f} "
          f"{r['ms_per_step']/1e3:7.2f} {attn(r)/1e3:7.2f} {r['cp_wait_ms']:8.0f} "
          f"{r['cp_bytes']/1e6:7.1f} {r['activation_mib']:9.1f} {r['peak_rss_mib']:8.0f} {eff:>8s}")
print(f"* {cores} cores for cp ranks: attention time scaled by cp/cores")
PY
echo
echo "llama-120m at 131072 tokens, B=1, bf16, ZeRO 1, one rank per host of this machine's memory"
echo "(keel's exact arena; on ONE host cp does not shrink the sum over its ranks):"
for cp in 1 2 4 8; do
  "$build/keel" plan --model llama-120m --seq 131072 --global-batch "$cp" \
    --accelerator this-cpu --accelerators "$cp" --per-node "$cp" --cp "$cp" --dp 1 --tp 1 \
    --pp 1 --zero 1 --micro-batch 1 --recompute none --accounting keel --json 2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
cp = int(sys.argv[1])
l = json.load(sys.stdin)["layouts"][0]
m = l["memory_bytes"]
act, used, cap = (m[k] / 2**30 for k in ("activations", "used", "capacity"))
verdict = "fits" if l["fits"] else "refused: " + l["reason"]
print(f"  cp {cp}: activations {act:6.2f} GiB, all {used:6.2f} GiB per rank ({cap:.2f} GiB a "
      f"host): {verdict}")' "$cp"
done
