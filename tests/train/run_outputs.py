"""What a `keel train` run left in its folder, for the layout tests' comparisons.

    import run_outputs as ro
    ro.metric(d, "pp2", "loss")        # one value per step (None where the step has no such key)
    w = ro.weights(d, "pp2")           # model.safetensors, tensor by tensor (fp32)
    ro.comparable("h.0.attn.c_attn.bias", w["h.0.attn.c_attn.bias"])
"""
import json
import struct

import numpy as np


def metric(d, name, key):
    return [json.loads(l).get(key) for l in open(f"{d}/{name}/metrics.jsonl")]


def weights(d, name):
    raw = open(f"{d}/{name}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=np.float32)
            for k, v in head.items() if k != "__metadata__"}


def comparable(k, a):
    # The key third of c_attn.bias has no gradient (softmax ignores a shift shared by all keys),
    # so AdamW moves it by the sign of rounding noise, which the summation order changes.
    if k.endswith("attn.c_attn.bias"):
        n = a.size // 3
        return np.concatenate([a[:n], a[2 * n:]])
    return a


def worst_weight_difference(w, ref):
    """The largest |w - ref| of any tensor, relative to that tensor's largest |ref|: (value, name)."""
    return max((float(np.max(np.abs(comparable(k, w[k]) - comparable(k, ref[k]))) /
                      (np.max(np.abs(comparable(k, ref[k]))) + 1e-6)), k) for k in ref)
