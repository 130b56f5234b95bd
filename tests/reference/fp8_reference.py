#!/usr/bin/env python3
"""fp8 numerics, written independently of keel (core/fp8.h), checked against what a keel fp8 run
recorded (KEEL_FP8_RECORD=DIR, model/fp8_state.h):

  views.*.bin    each fp8 view a product took: the tensor in, its scale and amax, the tensor out.
                 Checked: amax is max |x|; under current scaling the scale is 2^floor(log2(max /
                 amax)); out is x rounded to the format at that scale, bit for bit. The rounding
                 here is a table of every code's value (decoded from the OCP bit fields), the
                 nearest entry, ties to the even code, saturating at the largest finite value.
  steps.*.jsonl  each step's judgement of each tracker: its amax, the history's largest after the
                 step, and whether the block fell back. Replayed with a reference tracker (a
                 history of H amaxes; a fallback on a non-finite amax or, once H steps are known,
                 one above spike x the history's largest) that must agree step for step.

  fp8_reference.py DIR RECIPE HISTORY SPIKE   (RECIPE: current | delayed)
Prints what it checked; exits 1 on the first disagreement.
"""
import collections
import glob
import json
import math
import os
import struct
import sys

import numpy as np

FORMATS = {0: ("e4m3", 3, 7), 1: ("e5m2", 2, 15)}  # name, mantissa bits, bias


def decode(code, mbits, bias, e4m3):
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code & 0x7F) >> mbits, code & ((1 << mbits) - 1)
    top = (1 << (7 - mbits)) - 1
    if e4m3 and e == top and m == (1 << mbits) - 1:
        return math.nan
    if not e4m3 and e == top:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias)


def table(fmt):
    """The non-negative finite values, in code order (which is value order)."""
    _, mbits, bias = FORMATS[fmt]
    vals = [decode(c, mbits, bias, fmt == 0) for c in range(0x80)]
    return np.array([v for v in vals if math.isfinite(v)], dtype=np.float64)


TABLES = {f: table(f) for f in FORMATS}
MAX = {f: TABLES[f][-1] for f in FORMATS}
assert MAX[0] == 448.0 and MAX[1] == 57344.0, MAX


def round_ref(x, fmt):
    t = TABLES[fmt]
    a = np.minimum(np.abs(x.astype(np.float64)), t[-1])
    hi = np.clip(np.searchsorted(t, a), 1, len(t) - 1)
    lo = hi - 1
    dlo, dhi = a - t[lo], t[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    r = np.copysign(t[pick], x)
    return np.where(np.isnan(x), np.nan, r)


def scale_ref(amax, fmt):
    if not (amax > 0) or not math.isfinite(amax):
        return 1.0
    _, e = math.frexp(MAX[fmt] / amax)
    return 2.0 ** min(max(e - 1, -126), 126)


def to_bf16(x):
    """float64 values exactly representable in bf16 → their bf16 bits (round to nearest even)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def widen(raw, elem):
    if elem == 4:
        return np.frombuffer(raw, dtype=np.float32)
    bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def check_views(path, recipe, counts):
    data = open(path, "rb").read()
    off = 0
    while off < len(data):
        fmt, elem = struct.unpack_from("<ii", data, off)
        scale, amax = struct.unpack_from("<ff", data, off + 8)
        (n,) = struct.unpack_from("<Q", data, off + 16)
        off += 24
        x = widen(data[off:off + n * elem], elem)
        out_raw = data[off + n * elem:off + 2 * n * elem]
        off += 2 * n * elem
        name = FORMATS[fmt][0]
        want_amax = float(np.max(np.abs(x))) if n else 0.0
        if want_amax != amax:
            sys.exit(f"{path}: {name} view of {n}: amax {amax}, max |x| is {want_amax}")
        if recipe == "current" or counts["views"] < counts["first_step_views"]:
            want = scale_ref(amax, fmt)
            if want != scale:
                sys.exit(f"{path}: {name} view of {n}: scale {scale}, reference {want} "
                         f"(amax {amax})")
        if scale <= 0 or math.frexp(scale)[0] != 0.5:
            sys.exit(f"{path}: {name} view: scale {scale} is not a power of two")
        ref = round_ref(x.astype(np.float64) * scale, fmt) / scale
        if elem == 2:
            got = np.frombuffer(out_raw, dtype=np.uint16)
            bad = np.nonzero(got != to_bf16(ref))[0]
        else:
            got = np.frombuffer(out_raw, dtype=np.float32)
            bad = np.nonzero(got != ref.astype(np.float32))[0]
        if len(bad):
            i = bad[0]
            sys.exit(f"{path}: {name} view of {n} at scale {scale}: element {i} = {x[i]!r} came "
                     f"out {widen(out_raw[i * elem:(i + 1) * elem], elem)[0]!r}, reference "
                     f"{ref[i]!r} ({len(bad)} differ)")
        counts["views"] += 1
        counts["elements"] += n
        counts[name] += 1


def check_steps(path, history, spike, counts):
    trackers = collections.defaultdict(collections.deque)
    for line in open(path):
        r = json.loads(line)
        key = (r["layer"], r["product"], r["tensor"])
        h = trackers[key]
        amax = r["amax"]
        finite = amax is not None and math.isfinite(amax)
        hmax = max(h) if h else 0.0
        fall = (not finite) or (spike > 0 and len(h) >= history and hmax > 0
                                and amax > spike * hmax)
        if finite:
            h.append(amax)
            while len(h) > history:
                h.popleft()
        if fall != r["fallback"]:
            sys.exit(f"{path}: step {r['step']} block {key}: amax {amax}, history largest {hmax}:"
                     f" keel {'fell back' if r['fallback'] else 'went on'}, reference "
                     f"{'falls back' if fall else 'goes on'}")
        want_hmax = max(h) if h else 0.0
        if abs(want_hmax - r["history_max"]) > 1e-6 * max(1.0, want_hmax):
            sys.exit(f"{path}: step {r['step']} {key}: history largest {r['history_max']}, "
                     f"reference {want_hmax}")
        counts["judgements"] += 1
        counts["fallbacks"] += fall


def main():
    folder, recipe, history, spike = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    counts = collections.Counter()
    # Under delayed scaling the first step has no history and scales as current scaling does:
    # every view in the record is of the first step (KEEL_FP8_RECORD_VIEWS is below one step's).
    counts["first_step_views"] = 10 ** 9
    views = sorted(glob.glob(os.path.join(folder, "views.*.bin")))
    steps = sorted(glob.glob(os.path.join(folder, "steps.*.jsonl")))
    if not views or not steps:
        sys.exit(f"{folder}: no views.*.bin or steps.*.jsonl: was KEEL_FP8_RECORD set?")
    for v in views:
        check_views(v, recipe, counts)
    for s in steps:
        check_steps(s, history, spike, counts)
    print(f"fp8_reference: {counts['views']} views ({counts['e4m3']} E4M3, {counts['e5m2']} E5M2,"
          f" {counts['elements']} elements) bitwise equal to the reference rounding and scales; "
          f"{counts['judgements']} tracker judgements agree ({counts['fallbacks']} fallbacks)")
    if counts["e5m2"] == 0 or counts["e4m3"] == 0:
        sys.exit("fp8_reference: the record lacks one of the formats")


if __name__ == "__main__":
    main()
