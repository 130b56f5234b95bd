#!/usr/bin/env bash
# keel's causal attention (build/attention_bench) beside PyTorch's (bench/torch_attention.py) on
# the same shapes, in one invocation: GPT-2 124M's heads (C 768, 12 of 64), B = max(1, 1024 / T),
# fp32 and bf16, forward and backward, best of REPS. The peer runs at its best
# (bench/torch_peer.sh: every PEER_MALLOC × PEER_WAIT, the fastest counting).
#   bench/attention_bench.sh [T ...]   # default 256 1024 2048; BUILD=build REPS=5
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
py=${PYTHON:-/usr/bin/python3}
export REPS=${REPS:-5}
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(256 1024 2048)
[[ -f $build/build.ninja ]] || cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" -j2 attention_bench >/dev/null
source "$root/bench/torch_peer.sh"
[[ -n ${mallocs// /} ]] || mallocs=glibc

# Both sides on 2 threads, as the peer always runs.
keel=$(OMP_NUM_THREADS=2 "$build/attention_bench" "${lengths[@]}")
echo "$keel"
peer=$(for m in $mallocs; do
  for w in $waits; do
    peer_exec "$m" "$w" "$py" "$root/bench/torch_attention.py" --reps "$REPS" "${lengths[@]}"
  done
done)
KEEL_OUT=$keel PEER_OUT=$peer "$py" - <<'PY'
import json, math, os, re
keel = {}
for line in os.environ["KEEL_OUT"].splitlines():
    m = re.match(r"(\w+)\s+B=(\d+)\s+T=(\d+)\s+forward\s+([\d.]+) ms.*backward\s+([\d.]+) ms", line)
    if m:
        keel[(m[1], int(m[3]))] = (float(m[4]), float(m[5]), int(m[2]))
best = {}
for line in os.environ["PEER_OUT"].splitlines():
    r = json.loads(line)
    k = (r["dtype"], r["T"])
    if r["B"] != keel[k][2]:
        raise SystemExit(f"attention_bench.sh: {k}: PyTorch ran B={r['B']}, keel B={keel[k][2]}")
    f, b = best.get(k, (math.inf, math.inf))
    best[k] = (min(f, r["fwd_ms"]), min(b, r["bwd_ms"]))
    version = r["torch"]
print(f"PyTorch {version} (matmul, mask, softmax, matmul; autograd), 2 threads, best settings")
print(f"{'':5} {'T':>5} {'PyTorch fwd':>12} {'bwd':>10}   PyTorch ms / keel ms: fwd   bwd")
for (dtype, T), (f, b) in best.items():
    kf, kb, _ = keel[(dtype, T)]
    print(f"{dtype:5} {T:5} {f:9.2f} ms {b:7.2f} ms   {f / kf:25.2f}x {b / kb:5.2f}x")
PY
