"""PyTorch's side of bench/train_throughput.sh for keel's Llamas: the same model as keel's
(RMSNorm, rotary positions in Hugging Face's rotate-half layout, grouped-query attention, SwiGLU,
no biases, an untied lm_head, vocabulary padded to a multiple of 128 rows), trained in eager mode;
times full steps (forward, backward, gradient clipping, AdamW) and prints one JSON line shaped like
build/bench_train_step's.

    python3 bench/torch_llama.py llama-120m 4 256 bf16 [--steps 10] [--warmup 3] [--threads 2]

bf16 is torch.autocast('cpu', bfloat16) over fp32 master weights. Attention is the masked softmax
(torch 1.13 has no scaled_dot_product_attention), the key/value heads repeated for their query
heads. FLOPs per token use keel's formula (src/keel/monitor/flops.h) over the matrix parameters.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt2 import arguments, time_steps

CONFIGS = {  # n_layer, n_head, n_kv_head, n_embd, ffn_hidden, as src/keel/model/config.cc
    "llama-tiny": (2, 4, 2, 64, 176), "llama-mini": (4, 4, 2, 256, 688),
    "llama-120m": (12, 12, 4, 768, 2048),
}
VOCAB, THETA, EPS = 50257, 10000.0, 1e-5


class RMSNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS).to(x.dtype) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, nh, nkv, c, f):
        super().__init__()
        self.nh, self.nkv, self.hs = nh, nkv, c // nh
        self.ln_1, self.ln_2 = RMSNorm(c), RMSNorm(c)
        self.qkv = nn.Linear(c, (nh + 2 * nkv) * self.hs, bias=False)
        self.o_proj = nn.Linear(c, c, bias=False)
        self.gate_up = nn.Linear(c, 2 * f, bias=False)
        self.down_proj = nn.Linear(f, c, bias=False)

    def forward(self, x, mask, cos, sin):
        b, t, c = x.shape
        nh, nkv, hs = self.nh, self.nkv, self.hs
        q, k, v = self.qkv(self.ln_1(x)).split([nh * hs, nkv * hs, nkv * hs], dim=2)
        q = q.view(b, t, nh, hs).transpose(1, 2)
        k = k.view(b, t, nkv, hs).transpose(1, 2)
        v = v.view(b, t, nkv, hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        q, k, v = (z.reshape(b * nh, t, hs) for z in (q, k, v))
        att = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(hs)).softmax(-1)
        y = torch.bmm(att.to(v.dtype), v).view(b, nh, t, hs).transpose(1, 2).reshape(b, t, c)
        x = x + self.o_proj(y)
        g, u = self.gate_up(self.ln_2(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, n_layer, nh, nkv, c, f):
        super().__init__()
        vp = (VOCAB + 127) // 128 * 128
        self.hs = c // nh
        self.wte = nn.Embedding(vp, c)
        self.h = nn.ModuleList(Block(nh, nkv, c, f) for _ in range(n_layer))
        self.ln_f = RMSNorm(c)
        self.lm_head = nn.Linear(c, vp, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, std=std)
        with torch.no_grad():
            self.wte.weight[VOCAB:].zero_()
            self.lm_head.weight[VOCAB:].zero_()

    def forward(self, idx, targets):
        t = idx.shape[1]
        mask = torch.full((t, t), float("-inf")).triu_(1)
        inv = 1.0 / (THETA ** (torch.arange(0, self.hs, 2, dtype=torch.float32) / self.hs))
        emb = torch.cat([torch.outer(torch.arange(t, dtype=torch.float32), inv)] * 2, dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.wte(idx)
        for block in self.h:
            x = block(x, mask, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    a = arguments()
    n_layer, nh, nkv, c, f = CONFIGS[a.model]
    model = Llama(n_layer, nh, nkv, c, f)
    time_steps(model, a, sum(p.numel() for p in model.parameters()) - model.wte.weight.numel(),
               n_layer, c)


if __name__ == "__main__":
    main()
