"""Checks the metrics.jsonl of runs: check_metrics.py DIR NAME:RANKS ..."""
import json
import re
import sys

PHASES = ["data_ms", "forward_ms", "head_ms", "backward_ms", "dp_wait_ms", "tp_wait_ms", "cp_wait_ms",
          "pp_wait_ms",
          "tied_wait_ms", "sync_wait_ms", "optim_ms", "ckpt_ms", "checks_ms", "val_ms", "other_ms"]
d = sys.argv[1]
ok = True
for arg in sys.argv[2:]:
    name, ranks = arg.split(":")
    ranks = int(ranks)
    lines = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl")]
    log = open(f"{d}/{name}.log").read()
    n_params = int(re.search(r"(\d+) parameters", log).group(1))
    peak_all = float(re.search(r"; ([\d.]+) GFLOP/s for all ranks", log).group(1)) * 1e9
    # gpt2-tiny with 4 layers: 32 wide, context 64 (wpe is a lookup), 32-token sequences.
    if "gpt2-tiny" not in log:
        sys.exit(f"{name}: not the gpt2-tiny model this check counts the FLOPs of")
    L, C, block, T = 4, 32, 64, 32
    flops_per_token = 6 * (n_params - block * C) + 12 * L * C * T
    worst_other, problems = 0.0, []
    for m in lines:
        step = m["step"]
        phases = [m[k] for k in PHASES]
        if any(v < 0 for v in phases[:-1]):
            problems.append(f"step {step}: a negative phase: "
                            + ", ".join(f"{k} {m[k]:.3f}" for k in PHASES if m[k] < 0))
        total = sum(phases)
        if abs(total - m["ms"]) > 0.02 * m["ms"]:
            problems.append(f"step {step}: phases sum to {total:.3f} ms of {m['ms']:.3f}")
        worst_other = max(worst_other, abs(m["other_ms"]) / m["ms"])
        if abs(m["other_ms"]) > 0.02 * m["ms"] + 0.2:
            problems.append(f"step {step}: {m['other_ms']:.3f} ms of {m['ms']:.3f} unexplained")
        want_mfu = flops_per_token * m["tokens_per_s"] / peak_all
        # The log prints the peak to 0.1 GFLOP/s.
        if abs(m["mfu"] - want_mfu) > (0.051e9 / peak_all + 1e-9) * want_mfu:
            problems.append(f"step {step}: mfu {m['mfu']} but the model's FLOPs give {want_mfu}")
        if abs(m["tokens_per_s_per_rank"] * ranks - m["tokens_per_s"]) > 1e-6 * m["tokens_per_s"]:
            problems.append(f"step {step}: tokens_per_s_per_rank is not tokens_per_s / {ranks}")
        for key in ("rss_bytes", "peak_rss_bytes"):
            if len(m[key]) != ranks or min(m[key]) < 1e6:
                problems.append(f"step {step}: {key} {m[key]} for {ranks} rank(s)")
        if any(p < c for p, c in zip(m["peak_rss_bytes"], m["rss_bytes"])):
            problems.append(f"step {step}: peak resident memory below the current")
        if m["eta_s"] < 0:
            problems.append(f"step {step}: eta_s {m['eta_s']}")
    if lines[-1]["eta_s"] != 0:
        problems.append(f"the last step's ETA is {lines[-1]['eta_s']}, not 0")
    if name.startswith("pp") and not any(m["pp_wait_ms"] > 0 for m in lines):
        problems.append("a pipeline that never waited for a neighbour")
    if name.startswith("dp"):
        if not any(m["ckpt_ms"] > 0 for m in lines):
            problems.append("checkpoints every 5 steps and no checkpoint time")
        # The steps beside an async save are timed against the others, per step and per save.
        overlapped = [m["step"] for m in lines if "save_overlap_ms" in m]
        saves = [json.loads(l) for l in open(f"{d}/{name}/events.jsonl")]
        saves = [e for e in saves if e["event"] == "checkpoint"]
        if not overlapped or 6 not in overlapped:
            problems.append(f"no save_overlap_ms on the step after the step-5 save: {overlapped}")
        if any(m.get("save_overlap_ms", 0) < 0 for m in lines):
            problems.append("a negative save_overlap_ms")
        s5 = next((e for e in saves if e["step"] == 5), None)
        if not s5 or s5["overlapped_steps"] < 1 or s5["steps_lost_ms"] < 0 or any(
                k not in s5 for k in ("writer_user_ms", "writer_sys_ms", "fsync_ms")):
            problems.append(f"the step-5 save's event lacks its cost to the steps: {s5}")
    if not any(m["val_ms"] > 0 for m in lines):
        problems.append("validation every 10 steps and no validation time")
    print(f"{name}: {len(lines)} steps, phases cover each step (worst unexplained "
          f"{100 * worst_other:.2f}%), MFU over {peak_all / 1e9:.1f} GFLOP/s"
          + (" ok" if not problems else " FAIL"))
    for p in problems[:10]:
        print("  " + p)
    ok = ok and not problems
sys.exit(0 if ok else 1)
