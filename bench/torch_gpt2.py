"""PyTorch's side of bench/train_throughput.sh: the same GPT-2 as keel's (pre-LN, fused qkv, tanh
GELU, biases, token embedding padded to a multiple of 128 rows and tied to the classifier), trained
in eager mode at its best settings; times full steps (forward, backward, gradient clipping, AdamW)
and prints one JSON line shaped like build/bench_train_step's.

    python3 bench/torch_gpt2.py gpt2 4 256 bf16 [--steps 10] [--warmup 3] [--threads 2]

bf16 is torch.autocast('cpu', bfloat16) over fp32 master weights, as keel keeps fp32 masters.
Attention is the masked softmax (torch 1.13 has no scaled_dot_product_attention), with the causal
mask and the 1/sqrt(hs) scale folded into one baddbmm. The padded vocabulary rows start at zero and,
as in nanoGPT, stay in the softmax unmasked (masking them would cost a pass over the logits).
FLOPs per token use keel's formula (src/keel/monitor/flops.h).
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # n_layer, n_head, n_embd (vocab 50257, block 1024), as src/keel/model/config.cc
    "gpt2-tiny": (2, 2, 32), "gpt2-mini": (4, 4, 256), "small6": (6, 6, 384),
    "gpt2-small6": (6, 6, 384), "gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024),
}
VOCAB, BLOCK = 50257, 1024


class Block(nn.Module):
    def __init__(self, n_head, c):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        nh, hs = self.n_head, c // self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, nh, hs).transpose(1, 2).reshape(b * nh, t, hs) for z in (q, k, v))
        att = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(hs)).softmax(-1)
        y = torch.bmm(att.to(v.dtype), v).view(b, nh, t, hs).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, c):
        super().__init__()
        self.wte = nn.Embedding((VOCAB + 127) // 128 * 128, c)
        self.wpe = nn.Embedding(BLOCK, c)
        self.h = nn.ModuleList(Block(n_head, c) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif "bias" in name:
                nn.init.zeros_(p)
        with torch.no_grad():
            self.wte.weight[VOCAB:].zero_()

    def forward(self, idx, targets):
        t = idx.shape[1]
        mask = torch.full((t, t), float("-inf")).triu_(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x, mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def arguments():
    ap = argparse.ArgumentParser()
    ap.add_argument("model"), ap.add_argument("B", type=int), ap.add_argument("T", type=int)
    ap.add_argument("dtype", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--foreach", type=int, default=1, help="AdamW foreach kernels")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    return a


def time_steps(model, a, matmul_params, n_layer, c):
    """Times a.steps full steps (after a.warmup) of `model` on a random batch and prints the JSON
    line; FLOPs per token are keel's formula over `matmul_params`."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=bool(a.foreach))
    idx = torch.randint(0, VOCAB, (a.B, a.T))
    targets = torch.randint(0, VOCAB, (a.B, a.T))
    total = 0.0
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            total += time.perf_counter() - t0
    flops = 6.0 * matmul_params + 12.0 * n_layer * c * a.T
    tok_s = a.B * a.T * a.steps / total
    print(json.dumps({"impl": "torch", "version": torch.__version__, "model": a.model, "B": a.B,
                      "T": a.T, "dtype": a.dtype, "threads": torch.get_num_threads(),
                      "tokens_per_s": tok_s, "ms_per_step": 1e3 * total / a.steps,
                      "flops_per_token": flops, "loss": float(loss), "blas": blas_library(),
                      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
                      "ld_preload": os.path.basename(os.environ.get("LD_PRELOAD", "")),
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}))


def main():
    a = arguments()
    n_layer, n_head, c = CONFIGS[a.model]
    model = GPT(n_layer, n_head, c)
    params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    time_steps(model, a, params, n_layer, c)


def blas_library():
    """The BLAS this process loaded (fp32 matmuls go through it; bf16 ones through oneDNN), as
    folder/file: "blas/libblas.so.3.11.0" is the reference BLAS, far slower than OpenBLAS."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if ".so" in line}
    blas = sorted(p for p in libs if "blas" in os.path.basename(p))
    blas = [p for p in blas if "openblas" in os.path.basename(p)] or blas
    return "/".join(blas[0].split("/")[-2:]) if blas else ""


if __name__ == "__main__":
    main()
