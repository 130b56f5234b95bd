"""Drives `keel dashboard` in headless Chromium while a run trains:
dashboard_check.py URL RUN_DIR TRAIN_PID LOG_DIR

Every chart exists and, once the page has caught up, holds as many points as metrics.jsonl has
lines; a new step appears on the page within 3 s of its line; no errors on the page; a
screenshot goes to LOG_DIR/dashboard.png."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cdp import Browser

url, run, pid, logs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
CHARTS = {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory", "breakdown"}


def lines():
    try:
        return sum(1 for _ in open(f"{run}/metrics.jsonl"))
    except OSError:
        return 0


def alive():
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


problems = []
os.makedirs(logs, exist_ok=True)
with Browser(f"{logs}/chromium-profile") as b:
    b.navigate(url)
    state, deadline = None, time.time() + 60
    while time.time() < deadline:
        state = b.evaluate("window.keelState && keelState()")
        if state and state["lines"][0] > 0:
            break
        time.sleep(0.2)
    if not state or state["lines"][0] == 0:
        sys.exit(f"the page shows no step after 60 s: {state}")
    missing = CHARTS - set(state["charts"])
    if missing:
        problems.append(f"charts missing: {sorted(missing)}")

    # While the run trains: a line written now is on the page within 3 s.
    timings = []
    while alive() and len(timings) < 3:
        n = lines()
        t0 = time.time()
        while time.time() - t0 < 10 and lines() == n:
            time.sleep(0.02)
        if lines() == n:
            break
        t_line, want = time.time(), lines()
        while time.time() - t_line < 3:
            s = b.evaluate("keelState()")
            if s["lines"][0] >= want:
                break
            time.sleep(0.05)
        got = b.evaluate("keelState()")["lines"][0]
        timings.append(time.time() - t_line)
        if got < want:
            problems.append(f"step line {want} written, the page still shows {got} after 3 s")
    if not timings:
        problems.append("the run ended before a new step could be watched (a faster machine?)")

    # Caught up (the run has ended): every chart holds one point per line.
    while alive():
        time.sleep(0.2)
    final, t0 = lines(), time.time()
    while time.time() - t0 < 3:
        s = b.evaluate("keelState()")
        if all(v == final for v in s["charts"].values()):
            break
        time.sleep(0.1)
    for chart, n in s["charts"].items():
        if n != final:
            problems.append(f"chart {chart}: {n} points, metrics.jsonl {final} lines")
    if s["errors"] or b.console_errors:
        problems.append(f"errors on the page: {s['errors']}, console: {b.console_errors}")
    b.screenshot(f"{logs}/dashboard.png")

print(f"dashboard: {len(s['charts'])} charts, {final} points each; new steps on the page in "
      f"{', '.join(f'{t:.2f}' for t in timings)} s; screenshot {logs}/dashboard.png"
      + (" ok" if not problems else " FAIL"))
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
