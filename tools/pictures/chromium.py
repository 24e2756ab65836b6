"""Headless Chromium, the one browser the pictures and the docs' screenshots use:
where it is, the flags that keep it offline and alone, and one browser for many
pages (``Browser``: a screenshot, the DOM after the page's scripts ran). Debian: apt-get install -y chromium.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, Optional

# A fresh profile, no network, nothing but the page. --no-sandbox: CI runs as root.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
# A browser started for one page (`--screenshot`): the page's timers run out before it is read.
ONE_PAGE_FLAGS = FLAGS + ["--virtual-time-budget=10000"]


def find() -> Optional[str]:
    """Chromium's path, or None where it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    """One Chromium for many pages, driven over the DevTools protocol on a pipe
    (``--remote-debugging-pipe``: fd 3 in, fd 4 out, each message JSON ended by a NUL).
    A Chromium per page cost about 1.6 CPU-s each, 20 pages of the docs about 35 of
    the suite's (issue 50); one serves them all. Each page loads in a fresh tab, with
    the window's size, and is read once its load event has fired and two frames have
    been drawn (the pages' own scripts have run)."""

    def __init__(self, window: str = "1280,2400", timeout: float = 90) -> None:
        browser = find()
        if browser is None:
            raise FileNotFoundError("no Chromium on PATH: apt-get install -y chromium")
        self.width, self.height = (int(v) for v in window.split(","))
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        to_browser, self._send_fd = os.pipe()
        self._read_fd, from_browser = os.pipe()
        # The browser's ends above 4 first, so that placing them at 3 and 4 overwrites neither.
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)]
        os.close(to_browser)
        os.close(from_browser)
        try:
            self._proc = subprocess.Popen(
                [browser, *FLAGS, "--remote-debugging-pipe", "--user-data-dir=%s" % self._profile.name, "about:blank"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(ends[0], 3), os.dup2(ends[1], 4)))
        except BaseException:
            for fd in (self._send_fd, self._read_fd):
                os.close(fd)
            self._profile.cleanup()
            raise
        finally:
            for fd in ends:
                os.close(fd)
        self._buffer = b""
        self._next_id = 0

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self._send_fd, self._read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)  # the browser and every helper it started
        except OSError:
            pass
        self._proc.wait()
        self._profile.cleanup()

    def screenshot(self, url: str, png: str) -> None:
        session = self._open(url)
        shot = self._call("Page.captureScreenshot", {"format": "png"}, session)
        with open(png, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        self._close(session)

    def dom_after_scripts(self, url: str) -> str:
        session = self._open(url)
        got = self._call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                              "returnByValue": True}, session)
        self._close(session)
        return str(got["result"]["value"])

    def _open(self, url: str) -> Dict[str, str]:
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = {"sessionId": self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"],
                   "targetId": target}
        self._call("Page.enable", {}, session)
        self._call("Emulation.setDeviceMetricsOverride",
                   {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False}, session)
        self._call("Page.navigate", {"url": url}, session)
        self._wait_for("Page.loadEventFired", session)
        self._call("Runtime.evaluate", {"expression": "new Promise(r => requestAnimationFrame(() => "
                                                      "requestAnimationFrame(() => r(1))))",
                                        "awaitPromise": True}, session)
        return session

    def _close(self, session: Dict[str, str]) -> None:
        self._call("Target.closeTarget", {"targetId": session["targetId"]})

    def _call(self, method: str, params: Dict[str, Any], session: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session["sessionId"]
        os.write(self._send_fd, json.dumps(message).encode() + b"\0")
        reply = self._receive(lambda m: m.get("id") == self._next_id)
        if "error" in reply:
            raise RuntimeError("Chromium refused %s: %s" % (method, reply["error"].get("message")))
        return dict(reply.get("result", {}))

    def _wait_for(self, event: str, session: Dict[str, str]) -> None:
        self._receive(lambda m: m.get("method") == event and m.get("sessionId") == session["sessionId"])

    def _receive(self, wanted: Callable[[Dict[str, Any]], bool]) -> Dict[str, Any]:
        """Messages until the one wanted (the others, events of no interest, dropped)."""
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if wanted(message):
                    return dict(message)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read_fd], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer within %.0f s" % self.timeout)
            chunk = os.read(self._read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe (exit %s)" % self._proc.poll())
            self._buffer += chunk
