#!/usr/bin/env bash
# Usage: dashboard.sh KEEL SRC SHARED_DATA LOG_DIR
# keel dashboard in headless Chromium during a run (dashboard_check.py); the token rules; hostile
# input (dashboard_limits.py: lines over 1 MiB, a slowloris client, a reflected ?token=); keel
# report on two runs opened in Chromium without a network (every chart has its points) and
# rendered to PNGs of the right size that are not blank.
set -euo pipefail
keel=$1 src=$2 logs=$4
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_4layer "$3"
py=/usr/bin/python3
mkdir -p "$logs"

# A run to watch: slow enough (validation every 10 steps) that steps arrive while the page looks.
OMP_NUM_THREADS=1 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=live \
  --set train.steps=120 --set checkpoint.every_steps=20 >"$tmp/live.log" 2>&1 &
train=$!
until [ -s "$tmp/live/metrics.jsonl" ] || ! kill -0 $train 2>/dev/null; do sleep 0.1; done
# serve NAME ARGS...: keel dashboard ARGS in the background (pid in $dash), its URL in $url.
serve() {
  local out=$tmp/$1.out
  shift
  "$keel" dashboard "$@" >"$out" 2>&1 &
  dash=$!
  until grep -q "http://" "$out" 2>/dev/null; do
    kill -0 $dash 2>/dev/null || { cat "$out"; exit 1; }
    sleep 0.1
  done
  url=$(grep -o 'http://[^ ]*' "$out")
}

serve dash "$tmp/live" --port 0 --poll-ms 500
$py "$src/tests/monitor/dashboard_check.py" "$url" "$tmp/live" $train "$logs"
wait $train || { cat "$tmp/live.log"; exit 1; }
kill $dash
wait $dash || true

# The token: refused off loopback without one; with one, a request without it gets 401.
rc=0
"$keel" dashboard "$tmp/live" --addr 0.0.0.0 --port 0 >"$tmp/open.out" 2>&1 || rc=$?
((rc == 2)) && grep -q "reachable from other machines; pass --token" "$tmp/open.out" ||
  { echo "an open dashboard without a token: exit $rc"; cat "$tmp/open.out"; exit 1; }
serve tok "$tmp/live" --port 0 --token s3cret
base=${url%%\?*}
for path in "" "api/metrics?run=0" "chart.js"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$base$path")
  [ "$code" = 401 ] || { echo "GET /$path without the token: HTTP $code, expected 401"; exit 1; }
done
code=$(curl -s -o /dev/null -w '%{http_code}' "${base}api/metrics?run=0&token=s3cret")
[ "$code" = 200 ] || { echo "with the token: HTTP $code"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer s3cret" "${base}chart.js")
[ "$code" = 200 ] || { echo "with a Bearer header: HTTP $code"; exit 1; }
kill $dash
echo "token: exit 2 off loopback without one; 401 without it, 200 with it"

# Hostile input (issue 32): a run whose metrics.jsonl has lines of 9 MiB and 2 MiB between normal
# ones, then a slowloris client and a reflected ?token= (dashboard_limits.py).
mkdir -p "$tmp/long"
$py - "$tmp/long/metrics.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for step in range(1, 6):
        j = {"step": step, "loss": 4.0 - 0.1 * step, "ms": 10.0, "tokens_per_s": 100.0, "mfu": 0.1}
        if step == 2:
            j["pad"] = "x" * (9 << 20)
        if step == 4:
            j["pad"] = "y" * (2 << 20)
        f.write(json.dumps(j) + "\n")
PY
serve long "$tmp/long" --port 0 --poll-ms 200
(cd "$src/tests/monitor" && $py dashboard_limits.py "$url" "$logs")
kill $dash

# keel report on two runs, opened offline.
run other 1 --set train.steps=12 --set optim.lr=1e-3
"$keel" report "$tmp/live" "$tmp/other" --out "$tmp/report.html" --png "$tmp/png" >"$tmp/report.out"
$py - "$tmp" "$logs" <<'PY'
import json, os, subprocess, sys
from PIL import Image
d, logs = sys.argv[1], sys.argv[2]
want = {name: sum(1 for _ in open(f"{d}/{name}/metrics.jsonl")) for name in ("live", "other")}
# The page's state, from Chromium in a network namespace with no interfaces: nothing to fetch.
dom = subprocess.run(["unshare", "-n", "chromium", "--headless", "--disable-gpu", "--no-sandbox",
                      f"--user-data-dir={d}/profile", "--virtual-time-budget=5000", "--dump-dom",
                      f"file://{d}/report.html"], capture_output=True, text=True).stdout
start = dom.find('<pre id="state" hidden="">')
state = json.loads(dom[dom.index(">", start) + 1:dom.index("</pre>", start)])
ok = state["lines"] == [want["live"], want["other"]] and not state["errors"]
ok = ok and all(n == want["other" if c == "breakdown-1" else "live"]
                for c, n in state["charts"].items()) and len(state["charts"]) == 8
print(f"report offline: lines {state['lines']} (metrics.jsonl {want}), "
      f"{len(state['charts'])} charts, errors {state['errors']}" + (" ok" if ok else " FAIL"))
charts = ["loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory", "breakdown-0",
          "breakdown-1"]
for c in charts:
    im = Image.open(f"{d}/png/{c}.png").convert("RGB")
    colours = len(set(im.getdata()))
    good = im.size == (1000, 520) and colours > 20
    ok = ok and good
    if not good:
        print(f"png {c}: {im.size}, {colours} colours FAIL")
print(f"png: {len(charts)} charts, 1000x520, drawn" if ok else "png: FAIL")
import shutil
shutil.copy(f"{d}/png/loss.png", f"{logs}/report_loss.png")
sys.exit(0 if ok else 1)
PY
