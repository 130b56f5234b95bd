"""Scrapes keel's Prometheus endpoint during a run: scrape.py PORT TOKEN RUN_DIR

Waits for the endpoint, checks that a request without the token gets 401, then scrapes twice
(curl, parsed with prometheus_client): the counters grow, and the gauges are the metrics.jsonl
line of the step they name."""
import json
import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

port, token, run = sys.argv[1], sys.argv[2], sys.argv[3]
url = f"http://127.0.0.1:{port}/metrics"


def curl(*args):
    r = subprocess.run(["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", *args, url],
                       capture_output=True, text=True)
    body, _, code = r.stdout.rpartition("\n")
    return (int(code) if code.isdigit() else 0), body


def scrape():
    code, body = curl("-u", f"keel:{token}")
    if code != 200:
        return None
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out if ("keel_step", ()) in out else None


deadline = time.time() + 120
first = None
while time.time() < deadline and first is None:
    first = scrape()
    if first is None:
        time.sleep(0.1)
if first is None:
    sys.exit("no scrape with a step in 120 s")
code, _ = curl()
if code != 401:
    sys.exit(f"a request without the token got HTTP {code}, expected 401")
code, _ = curl("-u", "keel:wrong")
if code != 401:
    sys.exit(f"a request with a wrong token got HTTP {code}, expected 401")
time.sleep(1.0)
second = scrape()
if second is None:
    sys.exit("the second scrape failed")

problems = []
lines = {json.loads(l)["step"]: json.loads(l) for l in open(f"{run}/metrics.jsonl")}
for snap in (first, second):
    step = int(snap[("keel_step", ())])
    m = lines[step]
    for gauge, key in [("keel_loss", "loss"), ("keel_grad_norm", "grad_norm"),
                       ("keel_learning_rate", "lr"), ("keel_mfu", "mfu"),
                       ("keel_tokens_per_second", "tokens_per_s")]:
        if abs(snap[(gauge, ())] - m[key]) > 1e-9 * max(1.0, abs(m[key])):
            problems.append(f"step {step}: {gauge} {snap[(gauge, ())]} but metrics.jsonl has {m[key]}")
    fwd = snap[("keel_step_phase_seconds", (("phase", "forward"), ("rank", "0")))]
    if abs(fwd * 1e3 - m["forward_ms"]) > 1e-6 * m["forward_ms"]:
        problems.append(f"step {step}: forward {fwd * 1e3} ms, metrics.jsonl {m['forward_ms']}")
    rss = snap[("keel_rss_bytes", (("rank", "0"),))]
    if rss != m["rss_bytes"][0]:
        problems.append(f"step {step}: keel_rss_bytes {rss}, metrics.jsonl {m['rss_bytes'][0]}")
s1, s2 = int(first[("keel_step", ())]), int(second[("keel_step", ())])
for counter in ("keel_steps_total", "keel_tokens_total"):
    if not second[(counter, ())] > first[(counter, ())]:
        problems.append(f"{counter} did not grow: {first[(counter, ())]} then {second[(counter, ())]}")
print(f"scraped steps {s1} and {s2}: {len(first)} series; the gauges match metrics.jsonl, the "
      f"counters grew, 401 without the token" + (" ok" if not problems else " FAIL"))
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
