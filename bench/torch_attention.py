"""PyTorch's causal attention as its GPT-2 runs it (bench/attention_bench.sh's peer): q·kᵀ/√hs,
the causal mask, softmax, ·v under autograd, on GPT-2 124M's heads (C 768, 12 of 64) with
B = max(1, 1024 / T). Debian's PyTorch 1.13 has no fused attention on the CPU. Prints one JSON line
per (dtype, T): the best forward and backward milliseconds of --reps runs.

  python3 bench/torch_attention.py --reps 5 256 1024 2048
"""
import argparse
import json
import math
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("lengths", type=int, nargs="+")
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()
C, NH = 768, 12
hs = C // NH

for T in args.lengths:
    B = max(1, 1024 // T)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        g = torch.Generator().manual_seed(1)
        qkv = torch.randn(B, T, 3 * C, generator=g).to(dtype).requires_grad_()
        dout = torch.randn(B, T, C, generator=g).to(dtype)

        def forward():
            q, k, v = (x.view(B, T, NH, hs).transpose(1, 2) for x in qkv.split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            return (att @ v).transpose(1, 2).reshape(B, T, C)

        fwd = bwd = math.inf
        for _ in range(args.reps):
            t = time.perf_counter()
            out = forward()
            fwd = min(fwd, time.perf_counter() - t)
            t = time.perf_counter()
            out.backward(dout)
            bwd = min(bwd, time.perf_counter() - t)
            qkv.grad = None
        print(json.dumps({"dtype": name, "B": B, "T": T, "fwd_ms": 1e3 * fwd, "bwd_ms": 1e3 * bwd,
                          "torch": torch.__version__, "threads": torch.get_num_threads()}))
