#!/usr/bin/python3
"""Checks `keel ckpt export` against PyTorch: loads the export as a Hugging Face GPT-2.

Usage: hf_export_reference.py <export.safetensors> <keel_logits.safetensors>

The model below is written from Hugging Face's GPT2LMHeadModel (transformers' modeling_gpt2.py),
not from keel: its parameter names are HF's ("transformer.h.0.attn.c_attn.weight", ...), its
matrices are HF's Conv1D ([in, out], y = x @ W + b), c_attn's output splits into q, k, v, and the
classifier is tied to transformer.wte. The export is loaded with load_state_dict(strict=True), so
a missing, extra, misnamed or misshapen tensor fails, and then the float64 logits of keel's batch
must match keel's fp32 logits (dumped by dump_hf_export.cc) to relative error <= 1e-4
(max|keel - ref| / max|ref|), which a transposed square matrix or a swapped q/k/v would break.
The config comes from the file alone: shapes, and n_head from its metadata.
Needs Debian's python3-torch and numpy only (no safetensors or transformers package).
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"hf_export_reference.py: cannot import torch/numpy ({e}); "
             "run: apt-get install python3-torch python3-numpy (and use /usr/bin/python3)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import read_safetensors  # noqa: E402

TOL = 1e-4


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: weight (nx, nf) = [in, out]; y = x @ weight + bias."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.c_attn = Conv1D(3 * C, C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.c_attn(x).split(C, dim=2)  # HF's split_size = embed_dim
        q, k, v = (t.view(B, T, self.NH, hs).permute(0, 2, 1, 3) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).permute(0, 2, 1, 3).reshape(B, T, C))


class GPT2MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(4 * C, C)
        self.c_proj = Conv1D(C, 4 * C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # HF's "gelu_new"


class GPT2Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = GPT2Attention(C, NH)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = GPT2MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, L, NH, C, V, block_size):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(block_size, C)
        self.h = nn.ModuleList([GPT2Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)


class GPT2LMHeadModel(nn.Module):
    """lm_head is tied to transformer.wte (save_pretrained leaves lm_head.weight out)."""

    def __init__(self, L, NH, C, V, block_size):
        super().__init__()
        self.transformer = GPT2Model(L, NH, C, V, block_size)

    def forward(self, tokens):
        t = self.transformer
        x = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[1]))
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.t()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: hf_export_reference.py <export.safetensors> <keel_logits.safetensors>")
    torch.set_num_threads(2)
    export, logits_path = sys.argv[1], sys.argv[2]
    sd, meta = read_safetensors(export)
    failures = []
    if meta.get("format") != "pt":
        failures.append(f'metadata "format" is {meta.get("format")!r}, HF writes "pt"')
    V, C = sd["transformer.wte.weight"].shape
    block_size = sd["transformer.wpe.weight"].shape[0]
    L = sum(1 for k in sd if k.startswith("transformer.h.") and k.endswith(".ln_1.weight"))
    NH = int(meta["n_head"])
    print(f"{export}: GPT-2 with {L} layers, {NH} heads, {C} wide, vocabulary {V}, "
          f"context {block_size}")
    model = GPT2LMHeadModel(L, NH, C, V, block_size).double()
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        sys.exit(f"FAILED: the export is not an HF GPT-2 state dict: {e}")

    t, _ = read_safetensors(logits_path)
    tokens, keel_logits = t["tokens"].long(), t["logits"]
    with torch.no_grad():
        ref = model(tokens).reshape(-1, V)
    if tuple(keel_logits.shape) != tuple(ref.shape):
        sys.exit(f"FAILED: keel logits {tuple(keel_logits.shape)}, reference {tuple(ref.shape)}")
    err = float((keel_logits - ref).abs().max() / ref.abs().max())
    ok = err <= TOL
    print(f"  logits ({ref.shape[0]} x {V}), max|ref| {float(ref.abs().max()):.3f}: "
          f"rel_err {err:.3e} (tolerance {TOL:g})  {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(f"logits rel_err {err:.3e} > {TOL:g}")
    if failures:
        sys.exit("FAILED: " + "; ".join(failures))
    print("PASSED: keel's HF export loads as HF GPT-2 in PyTorch and gives keel's logits")


if __name__ == "__main__":
    main()
