#!/usr/bin/env bash
# Usage: dashboard_limits.sh KEEL LOG_DIR
# Starts keel dashboard on a run folder with lines over 1 MiB and runs dashboard_limits.py on it.
set -euo pipefail
keel=$1 logs=$2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
mkdir -p "$logs" "$tmp/run"
/usr/bin/python3 - "$tmp/run/metrics.jsonl" <<'PY'
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
"$keel" dashboard "$tmp/run" --port 0 --poll-ms 200 >"$tmp/dash.out" 2>&1 &
dash=$!
until grep -q "http://" "$tmp/dash.out" 2>/dev/null; do
  kill -0 $dash 2>/dev/null || { cat "$tmp/dash.out"; exit 1; }
  sleep 0.1
done
url=$(grep -o 'http://[^ ]*' "$tmp/dash.out")
cd "$(dirname "$0")"
/usr/bin/python3 dashboard_limits.py "$url" "$logs"
