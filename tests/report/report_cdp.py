"""A minimal Chrome DevTools Protocol client over --remote-debugging-pipe, for the report's browser test.

Why a pipe and the standard library rather than playwright or a websocket client: the pipe needs no
port, no extra package and no browser download; Debian's chromium is driven directly (fd 3 in,
fd 4 out, NUL-terminated JSON), so the test needs nothing beyond `apt-get install chromium`.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
]


class Browser:
    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="longca-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the child expects to read commands on fd 3 and write replies on fd 4
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={self._profile.name}",
                "--remote-debugging-pipe",
                "--window-size=1400,1000",
                "about:blank",
            ],
            pass_fds=(3, 4),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(to_child_r, 3), os.dup2(from_child_w, 4)) and None,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()
                else:
                    self.events.put(msg)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while self._next not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    raise TimeoutError(f"no reply to {method}")
            reply = self._replies.pop(self._next)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        self._profile.cleanup()


def load_page(
    browser: Browser, path: Path, screenshot: Path | None = None, wait_s: float = 60.0, script: str | None = None
) -> dict[str, Any]:
    """Open a file:// page in a fresh tab; returns its errors and, per chart container, its mark count.
    `script`: a JavaScript expression run once the charts are drawn (a promise is awaited); the
    string it gives is returned as "script"."""
    target = browser.send("Target.createTarget", url="about:blank")["targetId"]
    session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Runtime", "Log", "Page"):
        browser.send(f"{domain}.enable", session)
    browser.send("Page.navigate", session, url=path.resolve().as_uri())
    expr = """(() => {
      const done = document.body && document.body.getAttribute('data-charts-done');
      const charts = Array.from(document.querySelectorAll('div.chart')).map(d => ({
        id: d.id, rendered: d.getAttribute('data-rendered'),
        svg: d.querySelectorAll('.vis svg.marks, .vis canvas.marks').length,
        marks: d.querySelectorAll('.vis svg g[class*="role-mark"] > *').length,
        downloads: Array.from(d.querySelectorAll('.files a')).map(a => a.getAttribute('download'))}));
      return JSON.stringify({ready: document.readyState, done: done, charts: charts});
    })()"""
    deadline = time.monotonic() + wait_s
    while True:
        state = json.loads(browser.send("Runtime.evaluate", session, expression=expr)["result"]["value"])
        finished = state["ready"] == "complete" and (not state["charts"] or state["done"] is not None)
        if finished or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if script is not None:
        state["script"] = browser.send("Runtime.evaluate", session, expression=script, awaitPromise=True)["result"].get(
            "value"
        )
    if screenshot is not None:
        data = browser.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)["data"]
        import base64

        screenshot.write_bytes(base64.b64decode(data))
    errors = []
    while not browser.events.empty():
        ev = browser.events.get()
        if ev.get("sessionId") != session:
            continue
        p = ev.get("params", {})
        if ev["method"] == "Runtime.exceptionThrown":
            errors.append(json.dumps(p.get("exceptionDetails", {}))[:500])
        elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append(p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
    browser.send("Target.closeTarget", targetId=target)
    return {"errors": errors, **state}
