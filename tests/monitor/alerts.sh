#!/usr/bin/env bash
# Usage: alerts.sh KEEL SRC SHARED_DATA
# [monitor.alerts]: each rule fires exactly once on an injected condition (KEEL_FAULT, or a
# threshold the run is known to cross), into events.jsonl, the console and a webhook (a loopback
# HTTP server here); a clean run with every rule on fires none.
set -euo pipefail
keel=$1 src=$2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_4layer "$3"
py=/usr/bin/python3
common+=(--set train.steps=30 --set train.val_every=0 --set checkpoint.every_steps=0
         --set resilience.straggler_every=5 --set resilience.straggler_ratio=2 --set resilience.straggler_checks=2
         --set resilience.rollback=false)

# The webhook's receiver: appends each POST body as a line.
port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$py - "$port" "$tmp/posts.jsonl" <<'PY' &
import http.server, sys
out = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        open(out, "ab").write(body + b"\n")
        self.send_response(204)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY

# Injected: NaN gradients at step 6, rank 1 four times slower from step 16 (a straggler, and
# the job's throughput drops), a loss ceiling the first steps after warmup exceed, a disk that
# is always "too full", and no checkpoint for longer than 1.2 s.
KEEL_FAULT="nan_grad@5:0; slow@15:1,factor=4" run faults 2 \
  --set optim.warmup_steps=2 --set monitor.alerts.loss_ceiling=10.72 \
  --set monitor.alerts.throughput_drop=0.4 --set monitor.alerts.min_free_disk_gb=1e9 \
  --set monitor.alerts.checkpoint_age_min=0.02 \
  --set monitor.alerts.webhook="http://127.0.0.1:$port/alerts"
# Injected: rank 0 hangs in step 12's backward; the alert comes before the watchdog's exit 75.
rc=0
KEEL_FAULT="hang@11:0,phase=backward" OMP_NUM_THREADS=1 "$keel" train \
  "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=hang \
  --set monitor.alerts.no_step_s=2 --set resilience.hang_timeout_s=8 >"$tmp/hang.log" 2>&1 || rc=$?
((rc == 75)) || { echo "hang: exit $rc, expected 75"; cat "$tmp/hang.log"; exit 1; }
# Clean: every rule on, thresholds a healthy run stays within.
run clean 2 --set monitor.alerts.loss_ceiling=11.5 --set monitor.alerts.throughput_drop=0.6 \
  --set monitor.alerts.no_step_s=60 --set monitor.alerts.checkpoint_age_min=10 \
  --set monitor.alerts.min_free_disk_gb=0.001 --set monitor.alerts.webhook="http://127.0.0.1:$port/clean"
sleep 1  # the webhook thread posts after the event is written

$py - "$tmp" <<'PY'
import collections, json, sys
d = sys.argv[1]
def alerts(name):
    ev = [json.loads(l) for l in open(f"{d}/{name}/events.jsonl")]
    return [e for e in ev if e["event"] in ("alert", "alert_resolved")]
ok = True
def expect(cond, line):
    global ok
    print(("ok   " if cond else "FAIL ") + line)
    ok = ok and cond
got = alerts("faults")
fired = collections.Counter(e["rule"] for e in got if e["event"] == "alert")
for rule in ("nonfinite", "loss_ceiling", "throughput_drop", "straggler", "disk_space",
             "checkpoint_age"):
    first = next((e for e in got if e["rule"] == rule and e["event"] == "alert"), None)
    expect(fired[rule] == 1, f"faults: {rule} fired {fired[rule]} time(s)"
           + (f" at step {first['step']}: {first['message']}" if first else ""))
nan = next((e for e in got if e["rule"] == "nonfinite" and e["event"] == "alert"), {"step": None})
expect(nan["step"] == 6, f"faults: nonfinite at step {nan['step']} (NaN injected in step 6)")
expect(any(e["rule"] == "nonfinite" and e["event"] == "alert_resolved" for e in got),
       "faults: nonfinite resolved when the loss was finite again")
slow = next((e for e in got if e["rule"] == "straggler" and e["event"] == "alert"),
            {"message": "none", "step": 0})
expect("rank 1" in slow["message"] and slow["step"] >= 16,
       f"faults: the straggler is rank 1, from step 16 ({slow['message']})")
posts = [json.loads(l) for l in open(f"{d}/posts.jsonl")]
expect(sorted((p["rule"], p["event"], p["step"]) for p in posts)
       == sorted((e["rule"], e["event"], e["step"]) for e in got),
       f"webhook: received the {len(posts)} alert(s) events.jsonl has, and nothing from the clean run")
hang = alerts("hang")
expect([(e["rule"], e["event"]) for e in hang] == [("no_step", "alert")],
       f"hang: {[(e['rule'], e['event'], e['message']) for e in hang]}")
clean = alerts("clean")
expect(not clean, f"clean: {len(clean)} alert(s) {[e['message'] for e in clean]}")
sys.exit(0 if ok else 1)
PY
grep -q "keel: ALERT nonfinite: step 6" "$tmp/faults.log" || { echo "no ALERT line on the console"; exit 1; }
echo "console: $(grep -m1 'keel: ALERT' "$tmp/faults.log")"
