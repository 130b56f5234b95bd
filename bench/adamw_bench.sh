#!/usr/bin/env bash
# keel's AdamW in each optimizer-state tier (build/adamw_bench) and PyTorch's torch.optim.AdamW
# (fp32 parameters and state, foreach, the peer) on the same parameter count, in one invocation.
#   bench/adamw_bench.sh [N]        # default 33554432; BUILD=build
set -euo pipefail
n=${1:-33554432}
build=${BUILD:-build}
"$build/adamw_bench" "$n"
/usr/bin/python3 - "$n" <<'PY'
import sys, time, torch
n = int(sys.argv[1])
torch.manual_seed(0)
p = torch.nn.Parameter(torch.full((n,), 0.01))
p.grad = torch.full((n,), 1e-3)
opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, foreach=True)
best = 1e30
for _ in range(6):
    t = time.perf_counter()
    opt.step()
    best = min(best, time.perf_counter() - t)
print(f"PyTorch {torch.__version__} AdamW (fp32 parameters and state, foreach), "
      f"{torch.get_num_threads()} threads: {1e3 * best:8.2f} ms")
PY
