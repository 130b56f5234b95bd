"""What a `keel train` run left in its folder, for the layout tests' comparisons.

    import run_outputs as ro
    ro.metric(d, "pp2", "loss")        # one value per step (None where the step has no such key)
    w = ro.weights(d, "pp2")           # model.safetensors, tensor by tensor (fp32)
    ro.comparable("h.0.attn.c_attn.bias", w["h.0.attn.c_attn.bias"])
    ok = ro.check(d, "pp2", "ref-fp32", 1e-5, 1e-4)   # prints one line; False on a mismatch
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


def worst_weight_difference(w, ref, names=None):
    """The largest |w - ref| of any tensor (of `names`, default all), relative to that tensor's
    largest |ref|: (value, name)."""
    return max((float(np.max(np.abs(comparable(k, w[k]) - comparable(k, ref[k]))) /
                      (np.max(np.abs(comparable(k, ref[k]))) + 1e-6)), k)
               for k in (names if names is not None else ref))


def check(d, name, ref, limit, wlimit=None, first=0, steps=20, wlimits=None, glimit=None):
    """Run `name` against `ref`: every step's loss from step first + 1 on, and the gradient norm
    (every parameter counted once over stages and shards; within `glimit` when given) and
    validation loss (the forward-only path) within `limit` relative; with `wlimit`, the final
    weights too (a rank that dropped or double-counted a gradient breaks them), `wlimits` naming
    tensors held to another limit. Prints one line (and the steps on a failure)."""
    got, want = metric(d, name, "loss"), metric(d, ref, "loss")
    if len(got) != steps or len(want) != steps:
        print(f"{name}: {len(got)} steps (reference {len(want)}), expected {steps}")
        return False
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[first:], want[first:]))
    ok = worst <= limit
    line = (f"{name:14s} steps {first + 1}-{steps}: max relative loss difference {worst:.2e} "
            f"(limit {limit:g})")
    for key in ("grad_norm", "val_loss"):
        g = [x for x in metric(d, name, key)[first:] if x is not None]
        w = [x for x in metric(d, ref, key)[first:] if x is not None]
        if len(g) != len(w) or not g:
            ok, line = False, line + f", {key}: {len(g)} values vs {len(w)}"
            continue
        kw = max(abs(a - b) / abs(b) for a, b in zip(g, w))
        lim = glimit if key == "grad_norm" and glimit is not None else limit
        ok, line = ok and kw <= lim, line + f", {key} {kw:.1e}"
    if wlimit is not None:
        w, rw = weights(d, name), weights(d, ref)
        own = wlimits or {}
        ww, wk = worst_weight_difference(w, rw, [k for k in rw if k not in own])
        ok = ok and ww <= wlimit
        line += f", final weights {ww:.1e} ({wk}; limit {wlimit:g})"
        for k, lim in own.items():
            kw, _ = worst_weight_difference(w, rw, [k])
            ok = ok and kw <= lim
            line += f", {k} {kw:.1e} (limit {lim:g})"
    print(line + (" ok" if ok else " FAIL"))
    if not ok:
        for i, (a, b) in enumerate(zip(got, want)):
            print(f"  step {i+1}: {a:.8f} reference {b:.8f}")
    return ok
