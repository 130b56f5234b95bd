#!/usr/bin/env bash
# Training throughput, keel vs PyTorch eager, in one invocation: GPT-2 124M (B=4 T=256, B=4 T=64)
# and small6 (6 layers, 384 wide, B=8 T=256) (and Llamas: CONFIGS="llama-120m:4:256
# llama-tiny:8:64", bench/torch_llama.py their peer), fp32 and bf16, full steps (forward, backward,
# clipping, AdamW) on 2 threads. Prints the measured peak first (build/peak_flops), then a table of
# tokens/s, MFU against that peak (bf16: AMX where the CPU has it) and keel/PyTorch, then keel's per-kernel breakdown (124M B=4
# T=256 bf16).
#
#   bench/train_throughput.sh            # STEPS=10 WARMUP=3 timed/untimed steps per run
#   QUICK=1 bench/train_throughput.sh    # only 124M B=4 T=256
#   CONFIGS="small6:8:256" STEPS=1 WARMUP=1 bench/train_throughput.sh   # smoke
#
# The PyTorch peer runs at its best (bench/torch_peer.sh: its BLAS, OpenBLAS's core type, every
# combination of PEER_MALLOC and PEER_WAIT, the fastest counting). Raw JSON lines go to
# BUILD/train_throughput.jsonl.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
py=${PYTHON:-/usr/bin/python3}
steps=${STEPS:-10} warmup=${WARMUP:-3}
configs=${CONFIGS:-gpt2:4:256 gpt2:4:64 small6:8:256}
[[ ${QUICK:-0} == 1 ]] && configs="gpt2:4:256"
dtypes=${DTYPES:-fp32 bf16}
out=$build/train_throughput.jsonl

[[ -f $build/build.ninja ]] || cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" -j2 bench_train_step peak_flops >/dev/null

# PyTorch at its best (bench/torch_peer.sh): blas_dir, coretype, mallocs, waits, peer_exec.
source "$root/bench/torch_peer.sh"

peer() {  # MALLOC WAIT MODEL B T DTYPE
  local script=gpt2
  [[ $3 == llama* ]] && script=llama
  local malloc=$1 wait=$2
  shift 2
  peer_exec "$malloc" "$wait" "$py" "$root/bench/torch_${script}.py" "$@" --steps "$steps" \
    --warmup "$warmup" --threads 2
}

if ! peak=$("$build/peak_flops" 2 2>/dev/null); then
  # peak_flops's kernels need AVX-512: elsewhere, the peak keel measures and caches itself
  # (monitor/flops.h, MachinePeak), which a one-step run fills in.
  OMP_NUM_THREADS=2 "$build/bench_train_step" gpt2-tiny 1 16 fp32 1 0 >/dev/null
  peak=$("$py" - <<'PY'
import json, os
d = os.environ.get("KEEL_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keel")
cache = json.load(open(os.path.join(d, "peak_flops.json")))
e = next(v for k, v in cache.items() if k.endswith("| threads 2"))
print(json.dumps({"fp32_fma_gflops": e["fp32"] / 1e9, "bf16_dpbf16_gflops": e["bf16"] / 1e9,
                  "amx_bf16_gflops": 0.0, "source": "keel MachinePeak cache"}))
PY
)
fi
echo "peak: $peak"
: >"$out"
for c in $configs; do
  IFS=: read -r model B T <<<"$c"
  for dt in $dtypes; do
    OMP_NUM_THREADS=2 "$build/bench_train_step" "$model" "$B" "$T" "$dt" "$steps" "$warmup" >>"$out"
    for m in $mallocs; do
      for w in $waits; do peer "$m" "$w" "$model" "$B" "$T" "$dt" >>"$out"; done
    done
    echo "done: $model B=$B T=$T $dt" >&2
  done
done

"$py" - "$out" "$peak" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peak = json.loads(sys.argv[2])
fp32 = peak["fp32_fma_gflops"] * 1e9
vec_bf16 = max(fp32, peak["bf16_dpbf16_gflops"] * 1e9)  # best vector rate on bf16 inputs
amx = peak["amx_bf16_gflops"] * 1e9
pk_of = {"fp32": fp32, "bf16": max(vec_bf16, amx)}  # the machine's peak for the dtype
fpt = {}  # flops per token, from the peer (keel's formula, same parameter count)
best, worst = {}, {}
for r in rows:
    key = (r["model"], r["B"], r["T"], r["dtype"])
    if r["impl"] == "torch":
        fpt[key] = r["flops_per_token"]
        if key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]:
            best[key] = r
        worst[key] = min(worst.get(key, r["tokens_per_s"]), r["tokens_per_s"])
print(f"MFU against the measured peak: fp32 {fp32/1e9:.0f} GFLOP/s (FMA), bf16 "
      f"{pk_of['bf16']/1e9:.0f} GFLOP/s ({'AMX' if amx > vec_bf16 else 'vector'}); "
      f"bf16 vector peak {vec_bf16/1e9:.0f} GFLOP/s (max of FMA, vdpbf16ps). oneDNN, which runs "
      "keel's and PyTorch's matmuls, uses AMX for bf16 where the CPU has it.")
print(f"{'config':<22}{'dtype':<6}{'keel tok/s':>11}{'keel MFU':>9}{'torch tok/s':>12}"
      f"{'torch MFU':>10}{'keel/torch':>11}  peer settings")
for r in rows:
    key = (r["model"], r["B"], r["T"], r["dtype"])
    if r["impl"] != "keel" or key not in best:
        continue
    p, f, pk = best[key], fpt[key], pk_of[r["dtype"]]
    k_mfu, t_mfu = f * r["tokens_per_s"] / pk, f * p["tokens_per_s"] / pk
    extra = ""
    if r["dtype"] == "bf16" and pk > vec_bf16:
        extra = (f" (MFU vs the AVX-512 peak: keel {100*f*r['tokens_per_s']/vec_bf16:.1f}%, "
                 f"torch {100*f*p['tokens_per_s']/vec_bf16:.1f}%)")
    print(f"{r['model']+' B='+str(r['B'])+' T='+str(r['T']):<22}{r['dtype']:<6}"
          f"{r['tokens_per_s']:>11.0f}{100*k_mfu:>8.1f}%{p['tokens_per_s']:>12.0f}{100*t_mfu:>9.1f}%"
          f"{r['tokens_per_s']/p['tokens_per_s']:>10.2f}x  {p['omp_wait_policy']},"
          f"{p['ld_preload'] or 'glibc'},{p['blas']} (slowest setting {worst[key]:.0f}){extra}")
for r in rows:
    if r["impl"] == "keel" and (r["model"], r["B"], r["T"], r["dtype"]) == ("gpt2", 4, 256, "bf16"):
        roof = r.get("roofline", {})
        print("keel per-kernel ms/step, gpt2 B=4 T=256 bf16 "
              f"({r['ms_per_step']:.1f} ms/step in all; roofline: the kernel's bytes at "
              f"{r.get('bandwidth_gbs', 0):.1f} GB/s (memcpy traffic) or its FLOPs at the peak, bench/roofline.h):")
        print(f"  {'kernel':<14}{'ms':>9}  {'share':>6}{'floor ms':>10}{'of roofline':>13}  bound")
        for k, v in sorted(r["breakdown_ms"].items(), key=lambda kv: -kv[1]):
            rf = roof.get(k)
            tail = (f"{rf['floor_ms']:10.2f}{100*rf['of_roofline']:12.1f}%  {rf['bound']}"
                    if rf else "")
            print(f"  {k:<14}{v:9.2f}  {100*v/r['ms_per_step']:5.1f}%{tail}")
EOF
echo "raw results: $out"
