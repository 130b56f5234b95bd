#!/usr/bin/python3
"""Checks `keel eval` against PyTorch: the windowed loss of a model, in float64.

Usage: eval_reference.py <MODEL> <tokens.u16> <seq_len> <max_tokens> <keel_eval.json>

MODEL is a keel model file (keel's names, either family; shapes from its keel.* metadata), read
into the reference modules of model_reference.py, or a Hugging Face Llama folder as `keel ckpt
export` writes it, read and run as LlamaForCausalLM by hf_llama_reference.py. It cuts the flat
uint16 token file into keel eval's windows
(window w: tokens [w*T, w*T + T], inputs its first T, targets its last T; the first max_tokens // T
of them, or all for 0), and compares the mean loss with the "loss" of keel eval's --json line:
relative error <= 1e-4. Needs Debian's python3-torch and numpy only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama_reference as hf  # noqa: E402  (LlamaForCausalLM from an HF folder)
import model_reference as ref  # noqa: E402  (the GPT-2 and Llama modules, the safetensors reader)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOL = 1e-4


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    path, tokens_path, T, max_tokens, keel_json = sys.argv[1:]
    T, max_tokens = int(T), int(max_tokens)
    torch.set_num_threads(2)
    if os.path.isdir(path):  # an HF Llama folder
        config, weights = hf.load(path)
        meta = {"family": "llama (Hugging Face export)"}

        def model(x, y):
            return hf.forward(config, weights, x).reshape(-1, config["vocab_size"]), None
    else:
        t, meta = ref.read_safetensors(path)
        meta = {k[len("keel."):]: v for k, v in meta.items() if k.startswith("keel.")}
        meta["padded_vocab"] = str((int(meta["vocab_size"]) + 127) // 128 * 128)
        model = ref.build({"init." + k: v for k, v in t.items()}, meta)
    tokens = np.fromfile(tokens_path, dtype="<u2").astype(np.int64)
    windows = (len(tokens) - 1) // T
    if max_tokens:
        windows = min(windows, max_tokens // T)
    x = torch.from_numpy(np.stack([tokens[w * T:w * T + T] for w in range(windows)]))
    y = torch.from_numpy(np.stack([tokens[w * T + 1:w * T + T + 1] for w in range(windows)]))
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, 16):
            logits, _ = model(x[i:i + 16], y[i:i + 16])
            total += float(F.cross_entropy(logits, y[i:i + 16].reshape(-1), reduction="sum"))
    want = total / (windows * T)
    got = json.loads(open(keel_json).read().strip().splitlines()[-1])["loss"]
    err = abs(got - want) / abs(want)
    print(f"{path} ({meta.get('family', 'gpt2')}): keel eval {got:.8f}, PyTorch float64 {want:.8f} "
          f"over {windows} windows of {T}: relative error {err:.2e} (limit {TOL:g})")
    sys.exit(0 if err <= TOL else 1)


if __name__ == "__main__":
    main()
