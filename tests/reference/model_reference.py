#!/usr/bin/python3
"""PyTorch oracle for keel's models: recomputes in float64 what dump_model wrote and compares.

Usage: model_reference.py <dir>   (the dir dump_model wrote keel_{fp32,bf16}{,_sharp}.safetensors
to; the files' metadata say which family, GPT-2 or Llama, and its shapes)

Checks, per file written by tests/reference/dump_model.cc (keel's initial weights, and "sharp"
weights under which attention is peaked and GELU/SwiGLU nonlinear; the 10 steps only for the
former):
  fp32: loss, logits, every gradient: relative error <= 1e-4, and each of the 10 AdamW-step
        losses: relative error <= 1e-4.
  bf16: loss and each of the 10 step losses: relative error <= 1e-2; every gradient's cosine
        similarity with the float64 reference >= 0.99.
  fp16 (loss scale 1024, gradients unscaled): the same checks at fp16's tolerance, which its 10
        mantissa bits (bf16: 7) make tighter: relative error <= 3e-3, cosine >= 0.999.
        (PyTorch 1.13's CPU autocast has no float16, so the reference is float64 here too.)
Relative error of a tensor a against the reference b is max|a - b| / max|b| (one number per
tensor, so entries near zero, e.g. the key biases' exactly-zero gradients, do not blow it up).
Exits non-zero, naming the failing tensors. Needs Debian's python3-torch and numpy only.
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
    sys.exit(f"model_reference.py: cannot import torch/numpy ({e}); "
             "run: apt-get install python3-torch python3-numpy (and use /usr/bin/python3)")

FP32_TOL, BF16_LOSS_TOL, BF16_MIN_COS = 1e-4, 1e-2, 0.99
FP16_LOSS_TOL, FP16_MIN_COS = 3e-3, 0.999


def read_safetensors(path):
    """Returns ({name: float64 tensor}, metadata), reading the format by hand: an 8-byte
    little-endian header length, a JSON header, then the raw little-endian data (F32, BF16 or
    F16). The other reference scripts read their files with this too."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        raw = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=8 + n + lo)
        if h["dtype"] == "F32":
            a = raw.view("<f4").astype(np.float64)
        elif h["dtype"] == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view("<f4").astype(np.float64)
        elif h["dtype"] == "F16":
            a = raw.view("<f2").astype(np.float64)
        else:
            sys.exit(f"{path}: {name}: dtype {h['dtype']}, expected F32, BF16 or F16")
        out[name] = torch.from_numpy(a.reshape(h["shape"]))
    return out, meta


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)  # q|k|v, each C wide; head h: channels h*hs..
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 pre-LN; parameter names and [out, in] shapes are keel's."""

    def __init__(self, L, NH, C, V, Vp, block_size):
        super().__init__()
        self.V = V
        self.wte = nn.Embedding(Vp, C)  # padded rows: never looked up, logits masked (sliced)
        self.wpe = nn.Embedding(block_size, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight[:self.V].t()
        loss = F.cross_entropy(logits.view(-1, self.V), targets.view(-1))
        return logits.view(-1, self.V), loss


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    """Hugging Face Llama's rotary layout: channel i pairs with i + hs/2."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, NKV, F_, eps):
        super().__init__()
        self.NH, self.NKV, self.hs = NH, NKV, C // NH
        self.ln_1 = RMSNorm(C, eps)
        self.attn = nn.Module()
        self.attn.q_proj = nn.Linear(C, C, bias=False)
        self.attn.k_proj = nn.Linear(C, NKV * self.hs, bias=False)
        self.attn.v_proj = nn.Linear(C, NKV * self.hs, bias=False)
        self.attn.o_proj = nn.Linear(C, C, bias=False)
        self.ln_2 = RMSNorm(C, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(C, F_, bias=False)
        self.mlp.up_proj = nn.Linear(C, F_, bias=False)
        self.mlp.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.ln_1(x)
        q = self.attn.q_proj(h).view(B, T, self.NH, self.hs).transpose(1, 2)
        k = self.attn.k_proj(h).view(B, T, self.NKV, self.hs).transpose(1, 2)
        v = self.attn.v_proj(h).view(B, T, self.NKV, self.hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # Grouped-query attention: query head h reads key/value head h // (NH / NKV).
        k = k.repeat_interleave(self.NH // self.NKV, dim=1)
        v = v.repeat_interleave(self.NH // self.NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.attn.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        h = self.ln_2(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class Llama(nn.Module):
    """Llama (Hugging Face's LlamaForCausalLM arithmetic); parameter names are keel's."""

    def __init__(self, L, NH, NKV, C, F_, V, Vp, theta, eps):
        super().__init__()
        self.V, self.hs, self.theta = V, C // NH, theta
        self.wte = nn.Embedding(Vp, C)
        self.h = nn.ModuleList([LlamaBlock(C, NH, NKV, F_, eps) for _ in range(L)])
        self.ln_f = RMSNorm(C, eps)
        self.lm_head = nn.Linear(C, Vp, bias=False)  # padded rows sliced away below

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        inv_freq = self.theta ** (-torch.arange(0, self.hs, 2, dtype=torch.float64) / self.hs)
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.wte(tokens)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))[..., :self.V]
        loss = F.cross_entropy(logits.reshape(-1, self.V), targets.view(-1))
        return logits.reshape(-1, self.V), loss


def build(t, meta):
    i = lambda k: int(meta[k])
    if meta.get("family", "gpt2") == "llama":
        model = Llama(i("n_layer"), i("n_head"), i("n_kv_head"), i("n_embd"), i("ffn_hidden"),
                      i("vocab_size"), i("padded_vocab"), float(meta["rope_theta"]),
                      float(meta["norm_eps"])).double()
    else:
        model = GPT(i("n_layer"), i("n_head"), i("n_embd"), i("vocab_size"), i("padded_vocab"),
                    i("block_size")).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(t["init." + name])
    return model


def reference_run(t, meta, steps):
    """Float64 loss, logits and gradients at the initial weights, and the losses of `steps`
    AdamW steps with keel's formula (kernels/cpu/adamw.h) and clipping (optim::ClipScale)."""
    model = build(t, meta)
    tokens, targets = t["tokens"].long(), t["targets"].long()
    logits, loss = model(tokens, targets)
    loss.backward()
    ref = {"loss": loss.item(), "logits": logits.detach(),
           "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
    lr, b1, b2, eps, wd, clip = (float(meta[k]) for k in
                                 ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"))
    decay = set(meta["decay"].split(","))
    params = list(model.named_parameters())
    m = {n: torch.zeros_like(p) for n, p in params}
    v = {n: torch.zeros_like(p) for n, p in params}
    losses = []
    for step in range(1, steps + 1):
        model.zero_grad()
        _, loss = model(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for _, p in params))
        scale = clip / (norm + 1e-6) if norm > clip else 1.0
        with torch.no_grad():
            for n, p in params:
                g = p.grad * scale
                m[n].mul_(b1).add_((1 - b1) * g)
                v[n].mul_(b2).add_((1 - b2) * g * g)
                mh, vh = m[n] / (1 - b1 ** step), v[n] / (1 - b2 ** step)
                p.sub_(lr * (mh / (vh.sqrt() + eps) + (wd if n in decay else 0.0) * p))
    ref["train_losses"] = losses
    return ref


def rel_err(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def cosine(a, b):
    a, b = a.flatten(), b.flatten()
    na, nb = float(a.norm()), float(b.norm())
    return 1.0 if na == 0 and nb == 0 else float(a @ b) / max(na * nb, 1e-300)


def check(path):
    t, meta = read_safetensors(path)
    dtype = f"{meta.get('family', 'gpt2')} {meta['dtype']} {meta['weights']}"
    train = t["train_losses"].tolist() if "train_losses" in t else []
    ref = reference_run(t, meta, len(train))
    failures, rows = [], []

    def row(name, kind, value, ok):
        shown = f"{value:12.8f}" if kind == "cosine" else f"{value:12.3e}"
        rows.append(f"  {name:36s} {kind:8s} {shown}  {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(f"{dtype} {name}: {kind} {value:.3e}")

    if meta["dtype"] == "fp32":
        e = rel_err(t["loss"], ref["loss"])
        row("loss", "rel_err", e, e <= FP32_TOL)
        e = rel_err(t["logits"], ref["logits"])
        row("logits", "rel_err", e, e <= FP32_TOL)
        for n, g in ref["grads"].items():
            e = rel_err(t["grad." + n], g)
            row("grad." + n, "rel_err", e, e <= FP32_TOL)
        for s, (a, b) in enumerate(zip(train, ref["train_losses"])):
            e = abs(a - b) / abs(b)
            row(f"train_loss[{s}] {a:.6f} ref {b:.6f}", "rel_err", e, e <= FP32_TOL)
    else:
        tol, min_cos = ((FP16_LOSS_TOL, FP16_MIN_COS) if meta["dtype"] == "fp16"
                        else (BF16_LOSS_TOL, BF16_MIN_COS))
        e = rel_err(t["loss"], ref["loss"])
        row("loss", "rel_err", e, e <= tol)
        for n, g in ref["grads"].items():
            c = cosine(t["grad." + n], g)
            row("grad." + n, "cosine", c, c >= min_cos)
        for s, (a, b) in enumerate(zip(train, ref["train_losses"])):
            e = abs(a - b) / abs(b)
            row(f"train_loss[{s}] {a:.6f} ref {b:.6f}", "rel_err", e, e <= tol)
    print(f"{path}: keel {dtype} weights vs PyTorch float64 "
          "(rel_err = max|keel - ref| / max|ref| per tensor)")
    print("\n".join(rows))
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: model_reference.py <dir with keel_fp32/keel_bf16.safetensors>")
    torch.set_num_threads(2)
    failures = []
    for case in ("fp32", "bf16", "fp16", "fp32_sharp", "bf16_sharp", "fp16_sharp"):
        path = f"{sys.argv[1]}/keel_{case}.safetensors"
        # dump_model writes fp16 on the CPU backend only (scripts/gpu_check.sh runs `cuda`).
        if case.startswith("fp16") and not os.path.exists(path) and read_safetensors(
                f"{sys.argv[1]}/keel_fp32.safetensors")[1].get("device") == "cuda":
            print(f"{path}: not written (fp16 runs on the CPU backend only)")
            continue
        failures += check(path)
    if failures:
        print(f"FAILED: {len(failures)} check(s) out of tolerance:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASSED: keel matches the PyTorch reference")


if __name__ == "__main__":
    main()
