#!/usr/bin/python3
"""Checks `keel ckpt export --adapter` by PEFT's rules, in PyTorch, without keel or peft.

Usage: peft_reference.py <base> <adapter dir> <keel_logits.safetensors>

<base> is the Hugging Face export of the model the LoRA run started from (a GPT-2 .safetensors
with config.json beside it, or a Llama folder). The adapter folder is read as PEFT reads it:
adapter_config.json (r, lora_alpha, target_modules, fan_in_fan_out) and adapter_model.safetensors
("base_model.model.<module>.lora_A.weight" (r, in), "...lora_B.weight" (out, r)). Every targeted
module of every layer must have both tensors and every tensor must name a module of the base; each
module's weight then gets PEFT's merge, W += B @ A * lora_alpha / r (transposed for GPT-2's
Conv1D, fan_in_fan_out). With use_dora, PEFT's DoRA merge follows: each output row of W (out, in)
scaled to "<module>.lora_magnitude_vector" / its norm. The float64 logits of keel's batch
(dump_logits of the LoRA run, which keel merges itself) must match to relative error <= 1e-4;
DoRA's must also differ by more than that from the merge without the rescaling (the magnitudes
were trained and are read).
Needs Debian's python3-torch and numpy only.
"""
import json
import os
import sys

try:
    import torch
except ImportError as e:
    sys.exit(f"peft_reference.py: cannot import torch ({e}); run: apt-get install python3-torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_export_reference as gpt2  # noqa: E402
import hf_llama_reference as llama  # noqa: E402
from model_reference import read_safetensors  # noqa: E402

TOL = 1e-4


def apply_adapters(weights, adapter_dir, names, dora_rescale=True):
    """PEFT's merge into `weights` (HF names -> float64 tensors); `names` maps a module to its
    weight's name. Returns the number of modules merged."""
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    assert cfg["peft_type"] == "LORA", cfg["peft_type"]
    r, alpha, fan_in_fan_out = cfg["r"], cfg["lora_alpha"], cfg.get("fan_in_fan_out", False)
    dora = cfg.get("use_dora", False)
    ad, _ = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    prefix = "base_model.model."
    modules = sorted({k[len(prefix):].rsplit(".lora_", 1)[0] for k in ad})
    ends = (".lora_A.weight", ".lora_B.weight") + ((".lora_magnitude_vector",) if dora else ())
    for k in ad:
        assert k.startswith(prefix) and k.endswith(ends), k
    targeted = [m for m in names if any(m == t or m.endswith("." + t) for t in cfg["target_modules"])]
    assert sorted(targeted) == modules, f"adapters for {modules}, targets match {sorted(targeted)}"
    for m in modules:
        A = ad[f"{prefix}{m}.lora_A.weight"].double()
        B = ad[f"{prefix}{m}.lora_B.weight"].double()
        assert A.shape[0] == r and B.shape[1] == r, (m, A.shape, B.shape)
        delta = (B @ A) * (alpha / r)
        w = names[m]
        W = (weights[w].double().T if fan_in_fan_out else weights[w].double()) + delta  # (out, in)
        if dora and dora_rescale:
            mag = ad[f"{prefix}{m}.lora_magnitude_vector"].double()
            assert mag.shape == (W.shape[0],), (m, mag.shape)
            W = (mag / torch.linalg.norm(W, dim=1))[:, None] * W
        weights[w] = W.T if fan_in_fan_out else W
    return len(modules)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    torch.set_num_threads(2)
    base, adapter_dir, dump = sys.argv[1:]
    k, _ = read_safetensors(dump)
    tokens = k["tokens"].long()
    dora = json.load(open(os.path.join(adapter_dir, "adapter_config.json"))).get("use_dora", False)

    def logits(dora_rescale):
        with torch.no_grad():
            if os.path.isdir(base):
                c, w = llama.load(base)
                w = {n: t.double() for n, t in w.items()}
                mods = {n[:-len(".weight")]: n for n in w if n.endswith("_proj.weight")}
                merged = apply_adapters(w, adapter_dir, mods, dora_rescale)
                return merged, llama.forward(c, w, tokens).reshape(-1, c["vocab_size"])
            sd, meta = read_safetensors(base)
            sd = {n: t.double() for n, t in sd.items()}
            V, C = sd["transformer.wte.weight"].shape
            L = sum(1 for n in sd if n.endswith(".ln_1.weight"))
            mods = {n[:-len(".weight")]: n for n in sd
                    if n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))}
            merged = apply_adapters(sd, adapter_dir, mods, dora_rescale)
            model = gpt2.GPT2LMHeadModel(L, int(meta["n_head"]), C, V,
                                         sd["transformer.wpe.weight"].shape[0]).double()
            model.load_state_dict(sd, strict=True)
            return merged, model(tokens).reshape(-1, V)

    merged, ref = logits(True)
    err = float((k["logits"] - ref).abs().max() / ref.abs().max())
    rule = "PEFT's DoRA rule" if dora else "PEFT's rule"
    print(f"{adapter_dir}: {merged} modules merged by {rule} onto {base}: logits relative "
          f"error {err:.2e} (limit {TOL:g})")
    if not err <= TOL:
        sys.exit("FAILED: the PEFT adapters on the base do not give keel's LoRA model")
    if dora:
        _, plain = logits(False)
        off = float((k["logits"] - plain).abs().max() / plain.abs().max())
        print(f"without DoRA's rescaling the logits would be {off:.2e} off")
        if not off > TOL:
            sys.exit("FAILED: the DoRA magnitudes change nothing (not trained, or not read)")
    print("PASSED")


if __name__ == "__main__":
    main()
