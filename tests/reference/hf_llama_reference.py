#!/usr/bin/python3
"""Hugging Face Llama in and out of keel, against PyTorch.

  hf_llama_reference.py make DIR
      Writes a random Llama as transformers' save_pretrained lays it out: DIR/config.json and
      two BF16 shards listed by DIR/model.safetensors.index.json, under HF's names
      ("model.layers.0.self_attn.q_proj.weight", ...), with an untied lm_head, 4 query heads on 2
      key/value heads, a vocabulary (1000) that keel pads, and weights large enough that attention
      is peaked: a swapped q/k, a wrong rotary layout or a transposed matrix moves the logits far
      past the tolerance.
  hf_llama_reference.py check DIR KEEL_DUMP
      Loads DIR (config.json, the index or model.safetensors; every tensor must be used and every
      parameter present, as load_state_dict(strict=True)) into a float64 Llama written from
      transformers' LlamaForCausalLM and compares with dump_logits' output: logits relative error
      <= 1e-4 (max|keel - ref| / max|ref|) and the same greedy continuation of 32 tokens.
Needs Debian's python3-torch and numpy only (no transformers or safetensors package).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import read_safetensors  # noqa: E402

TOL = 1e-4
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 64,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def write_safetensors(path, tensors):
    """BF16 (round to nearest even), as save_pretrained writes a bfloat16 model."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        bits = t.float().numpy().astype("<f4").view("<u4").astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [off, off + len(bits)]}
        blobs.append(bits)
        off += len(bits)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_names(c):
    names = {"model.embed_tokens.weight": (c["vocab_size"], c["hidden_size"]),
             "model.norm.weight": (c["hidden_size"],)}
    if not c.get("tie_word_embeddings", False):
        names["lm_head.weight"] = (c["vocab_size"], c["hidden_size"])
    h, f = c["hidden_size"], c["intermediate_size"]
    kv = c.get("num_key_value_heads", c["num_attention_heads"]) * h // c["num_attention_heads"]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        names.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                      p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                      p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                      p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                      p + "mlp.down_proj.weight": (h, f)})
    return names


def make(d):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(11)
    tensors = {}
    for name, shape in hf_names(CONFIG).items():
        if len(shape) == 1:
            tensors[name] = 1 + 0.2 * torch.randn(shape, generator=g)
        else:
            tensors[name] = 0.3 * torch.randn(shape, generator=g)
    names = sorted(tensors)
    shards = [names[:len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(d, file), {n: tensors[n] for n in part})
        weight_map.update({n: file for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)
    json.dump(CONFIG, open(os.path.join(d, "config.json"), "w"), indent=2)
    print(f"wrote {d}: {len(tensors)} tensors in 2 BF16 shards")


def load(d):
    c = json.load(open(os.path.join(d, "config.json")))
    assert c["model_type"] == "llama", c["model_type"]
    index = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(d, f))[0])
    want = hf_names(c)
    extra, missing = set(w) - set(want), set(want) - set(w)
    assert not extra and not missing, f"unexpected {sorted(extra)}, missing {sorted(missing)}"
    for n, s in want.items():
        assert tuple(w[n].shape) == s, f"{n}: shape {tuple(w[n].shape)}, expected {s}"
    return c, w


def forward(c, w, tokens):
    """LlamaForCausalLM's arithmetic in float64 (modeling_llama.py), logits (B, T, V)."""
    H, NH = c["hidden_size"], c["num_attention_heads"]
    NKV, hs, eps = c.get("num_key_value_heads", NH), H // NH, c["rms_norm_eps"]
    B, T = tokens.shape

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wt

    def rot(x):
        return torch.cat((-x[..., hs // 2:], x[..., :hs // 2]), dim=-1)

    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv)] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, NH, hs).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, NKV, hs).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, NKV, hs).transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
        att = (q @ k.transpose(-2, -1) / math.sqrt(hs)).masked_fill(~mask, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T


def check(d, dump):
    c, w = load(d)
    k, meta = read_safetensors(dump)
    tokens = k["tokens"].long()
    with torch.no_grad():
        ref = forward(c, w, tokens).reshape(-1, c["vocab_size"])
        err = float((k["logits"] - ref).abs().max() / ref.abs().max())
        P = int(meta["prompt_tokens"])
        seq = tokens[0, :P].tolist()
        for _ in range(len(k["greedy"])):
            seq.append(int(forward(c, w, torch.tensor([seq]))[0, -1].argmax()))
    keel_greedy = [int(x) for x in k["greedy"].tolist()]
    same = keel_greedy == seq[P:]
    print(f"{d}: logits relative error {err:.2e} (limit {TOL:g}); greedy {len(keel_greedy)} "
          f"tokens {'identical' if same else 'DIFFERENT'}")
    if not same:
        print(f"  keel    {keel_greedy}\n  PyTorch {seq[P:]}")
    return err <= TOL and same


def main():
    torch.set_num_threads(2)
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3]) else 1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
