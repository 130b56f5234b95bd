#!/usr/bin/python3
"""Writes a Hugging Face Llama folder of random bf16 weights (normal, std 0.02; norms 1): the
shape of a real model for benchmarks that read one (a LoRA run's base streamed from its file)
where no model can be downloaded. Tensors are drawn and written one at a time into shards of
about 5 GB, as `transformers` saves them, so that an 8B folder needs little memory.

  /usr/bin/python3 bench/random_hf_llama.py OUT_DIR [--layers 32 --hidden 4096 --heads 32
      --kv-heads 8 --ffn 14336 --vocab 128256]
"""
import argparse
import json
import os
import struct

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--hidden", type=int, default=4096)
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=8)
ap.add_argument("--ffn", type=int, default=14336)
ap.add_argument("--vocab", type=int, default=128256)
ap.add_argument("--shard-gb", type=float, default=5.0)
a = ap.parse_args()
C, F, V, hd = a.hidden, a.ffn, a.vocab, a.hidden // a.heads
kv = a.kv_heads * hd
tensors = [("model.embed_tokens.weight", (V, C))]
for l in range(a.layers):
    p = f"model.layers.{l}."
    tensors += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (C, C)), (p + "self_attn.k_proj.weight", (kv, C)),
                (p + "self_attn.v_proj.weight", (kv, C)), (p + "self_attn.o_proj.weight", (C, C)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F))]
tensors += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
shards, cur, size = [], [], 0
for name, shape in tensors:
    n = int(np.prod(shape)) * 2
    if cur and size + n > a.shard_gb * 1e9:
        shards.append(cur)
        cur, size = [], 0
    cur.append((name, shape))
    size += n
shards.append(cur)
os.makedirs(a.out, exist_ok=True)
rng = np.random.default_rng(0)
weight_map = {}
for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    header, off = {}, 0
    for name, shape in shard:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
        weight_map[name] = fname
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(a.out, fname), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in shard:
            if name.endswith("norm.weight"):
                x = np.ones(shape, np.float32)
            else:
                x = rng.standard_normal(shape, np.float32) * np.float32(0.02)
            f.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # bf16, truncated
    print(f"{fname}: {len(shard)} tensors, {off / 1e9:.2f} GB", flush=True)
json.dump({"metadata": {"total_size": sum(int(np.prod(s)) * 2 for _, s in tensors)},
           "weight_map": weight_map}, open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "intermediate_size": F, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "num_hidden_layers": a.layers, "vocab_size": V,
           "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
           "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
          open(os.path.join(a.out, "config.json"), "w"), indent=2)
