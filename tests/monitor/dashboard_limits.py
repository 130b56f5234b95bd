"""keel dashboard under hostile input (issue 32), against a running `keel dashboard`:

  reflected   a ?token= sent to a server without one never reaches the page's HTML;
  long lines  a run whose metrics.jsonl has lines of 9 MiB and 2 MiB between normal ones: the API
              skips them (counted in "skipped") and goes on to the lines after them, and the page
              (headless Chromium) shows every normal step and the count;
  slowloris   20 connections from 127.0.0.2, each sending a byte a second and never finishing its
              request: at most 6 stay open (the per-client cap), the page still loads for
              127.0.0.1 within 3 s, and the slow ones are closed by the 15 s deadline.

Usage: dashboard_limits.py URL LOG_DIR (from dashboard.sh, which starts the dashboard)
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.request

from cdp import Browser

url, logs = sys.argv[1], sys.argv[2]
host, port = url.split("//")[1].rstrip("/").split(":")
port = int(port)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def api(since):
    with urllib.request.urlopen(f"{url}api/metrics?run=0&since={since}", timeout=10) as r:
        return json.load(r)


steps, skipped, since = [], 0, 0
for _ in range(6):
    r = api(since)
    steps += [line["step"] for line in r["lines"]]
    skipped += r.get("skipped", 0)
    if r["next"] == since:
        break
    since = r["next"]
if steps != [1, 3, 5] or skipped != 2:
    fail(f"API: steps {steps}, skipped {skipped}; expected [1, 3, 5] and 2")
print("long lines: API steps", steps, "skipped", skipped)

with Browser(os.path.join(logs, "limits-profile")) as b:
    b.navigate(url)
    state = None
    for _ in range(100):
        state = b.evaluate("window.keelState && keelState()")
        if state and state["lines"] == [3] and state["skipped"] == [2]:
            break
        time.sleep(0.1)
    text = b.evaluate("document.getElementById('warnings').textContent")
    if not state or state["lines"] != [3] or state["skipped"] != [2] or "2 line(s)" not in text:
        fail(f"page: state {state}, warning {text!r}")
    if state["errors"]:
        fail(f"page errors: {state['errors']}")
print("long lines: page shows 3 steps and", repr(text))


# A ?token= on a server without one is not copied into the page (it was, unescaped: a reflected
# script).
evil = "%22%3E%3C/script%3E%3Cscript%3Ealert(1)%3C/script%3E"
with urllib.request.urlopen(f"{url}?token={evil}", timeout=10) as r:
    page = r.read().decode()
if "alert(1)" in page:
    fail("the request's ?token= was copied into the page")
print("reflected token: not in the page")


def closed(s):
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


slow = []
for _ in range(20):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect((host, port))
    s.sendall(b"GET / HTTP/1.1\r\n")
    slow.append(s)
stop = threading.Event()


def drip():
    while not stop.is_set():
        for s in slow:
            try:
                s.send(b"X")
            except OSError:
                pass
        time.sleep(1)


threading.Thread(target=drip, daemon=True).start()
time.sleep(1)
still = sum(not closed(s) for s in slow)
if still > 6:
    fail(f"{still} slow connections from one address are open; expected at most 6")
t = time.time()
try:
    with urllib.request.urlopen(url, timeout=3) as r:
        status = r.status
except Exception as e:  # noqa: BLE001 - any failure to load is the finding
    fail(f"the page did not load beside the slow clients: {e}")
print(f"slowloris: {still} of 20 slow connections open; page {status} in {time.time() - t:.2f} s")
time.sleep(16)
still = sum(not closed(s) for s in slow)
stop.set()
if still:
    fail(f"{still} slow connections still open after 17 s (deadline 15 s)")
print("slowloris: every slow connection closed by its deadline")
