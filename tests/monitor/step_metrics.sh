#!/usr/bin/env bash
# Usage: step_metrics.sh KEEL SRC SHARED_DATA
# Runs tiny trainings in four layouts and checks every metrics.jsonl line: the phases are never
# negative and leave under 2% of the step unexplained; MFU is the model's FLOPs over the peak the
# log names; memory per rank and the ETA are there. Then the peak's cache (and AVX2's for a run
# held to it), and the Prometheus
# endpoint: scraped twice during a run, refused without its token.
set -euo pipefail
keel=$1 src=$2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
source "$src/tests/train/run_lib.sh"
tiny_4layer "$3"
export KEEL_CACHE_DIR=$tmp/cache
py=/usr/bin/python3

run dp2 2 --set parallel.zero=1 --set checkpoint.every_steps=5
run tp2 2 --set parallel.tp=2
run pp2 2 --set parallel.pp=2
run one 1 --set monitor.peak_gflops=7.5 --set checkpoint.every_steps=10 \
  --set checkpoint.direct_io=true
$py "$src/tests/monitor/check_metrics.py" "$tmp" dp2:2 tp2:2 pp2:2 one:1

# O_DIRECT saves where this file system takes them (not tmpfs), the same bytes as dp2's
# plain ones would verify alike: every save of `one` verifies, and says how it was written.
$py - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
try:
    os.close(os.open(f"{d}/probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    takes = True
except OSError:
    takes = False
saves = [json.loads(l) for l in open(f"{d}/one/events.jsonl") if '"checkpoint"' in l]
saves = [e for e in saves if e["event"] == "checkpoint"]
if not saves or any(e["direct_io"] != takes for e in saves):
    sys.exit(f"direct_io: the file system {'takes' if takes else 'refuses'} O_DIRECT, saves say "
             f"{[e['direct_io'] for e in saves]}")
print(f"direct_io: {len(saves)} saves, O_DIRECT {'used' if takes else 'refused here: plain writes'}")
PY
"$keel" ckpt verify "$tmp/one/checkpoints" >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log"; exit 1; }

# The peak: measured once (dp2's first start wrote the cache), then read back by every run.
grep -q "measured on this CPU now, cached in $KEEL_CACHE_DIR/peak_flops.json" "$tmp/dp2.log" ||
  { echo "dp2 did not measure the peak:"; grep "MFU against" "$tmp/dp2.log"; exit 1; }
grep -q "measured on this CPU, cached in $KEEL_CACHE_DIR/peak_flops.json" "$tmp/tp2.log" ||
  { echo "tp2 did not read the cached peak:"; grep "MFU against" "$tmp/tp2.log"; exit 1; }
grep -q "peak of 7.5 GFLOP/s for rank 0's 1 thread(s) in fp32 (\[monitor\] peak_gflops)" \
  "$tmp/one.log" || { echo "one: the override is not the peak:"; grep "MFU" "$tmp/one.log"; exit 1; }
grep -q "| ETA " "$tmp/one.log" || { echo "no ETA on the step line"; exit 1; }
echo "peak: measured, cached, read back, overridden"
# A run held to AVX2 (keel's kernels and oneDNN's) is measured against 256-bit FMAs, as the
# benchmark's quickstart-avx2 is, not against the host's AVX-512 or AMX peak.
KEEL_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 run avx2 1 --set train.steps=2
grep -q "MFU against .*(AVX2 FMA)" "$tmp/avx2.log" ||
  { echo "avx2: not measured against the AVX2 peak:"; grep "MFU against" "$tmp/avx2.log"; exit 1; }
echo "avx2: $(grep -o 'MFU against.*' "$tmp/avx2.log")"

# Prometheus: a non-loopback address needs a token; a request without it gets 401.
refused open 1 "metrics_addr: \"0.0.0.0\" is reachable from other machines" \
  --set monitor.metrics_port=9 --set monitor.metrics_addr=0.0.0.0
port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OMP_NUM_THREADS=1 "$keel" train "$src/configs/test-tiny.toml" "${common[@]}" --set train.name=prom \
  --set train.steps=60 --set train.val_every=30 --set monitor.metrics_port="$port" \
  --set monitor.metrics_token=s3cret >"$tmp/prom.log" 2>&1 &
$py "$src/tests/monitor/scrape.py" "$port" s3cret "$tmp/prom"
wait $! || { cat "$tmp/prom.log"; exit 1; }
$py - "$port" <<'PY'
import socket, sys
s = socket.socket()
if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0:
    sys.exit("the endpoint is still open after the run ended")
print("the endpoint closed with the run")
PY
