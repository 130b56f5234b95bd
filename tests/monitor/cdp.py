"""A minimal Chrome DevTools Protocol client over headless Chromium (python3-websocket).

    with Browser(profile_dir) as b:
        b.navigate("http://127.0.0.1:8800/")
        state = b.evaluate("keelState()")
        b.screenshot("page.png")
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import websocket


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Browser:
    def __init__(self, profile, width=1400, height=1000):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
             f"--remote-debugging-port={self.port}", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.profile = profile
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list") as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("chromium did not open its DevTools port in 60 s")
            time.sleep(0.2)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0
        # What the DevTools console shows as errors: uncaught exceptions, console.error, failed
        # loads (a 404), seen as events while calls wait for their answers.
        self.console_errors = []
        self.call("Runtime.enable")
        self.call("Log.enable")

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            self._note(msg)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def _note(self, msg):
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.console_errors.append(p["exceptionDetails"].get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and p.get("type") == "error":
            self.console_errors.append(" ".join(str(a.get("value", a.get("description")))
                                                for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            self.console_errors.append(p["entry"].get("text", "") + " " + p["entry"].get("url", ""))

    def navigate(self, url):
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expr):
        r = self.call("Runtime.evaluate", expression=f"JSON.stringify({expr})",
                      returnByValue=True)
        if r.get("exceptionDetails") or "value" not in r["result"]:
            return None  # not defined yet (the page is loading), or undefined
        return json.loads(r["result"]["value"])

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ws.close()
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
