"""Headless Chromium, the one browser the pictures and the docs' screenshots use:
where it is, the flags that keep it offline and alone, and its two uses (a
screenshot, the DOM after the page's scripts ran). Debian: apt-get install -y chromium.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from typing import List, Optional

# A fresh profile, no network, nothing but the page. --no-sandbox: CI runs as root.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=10000"]


def find() -> Optional[str]:
    """Chromium's path, or None where it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _run(args: List[str], timeout: float) -> str:
    """Chromium with a profile of its own (so that two can run at once), its
    whole process group ended whatever happens."""
    browser = find()
    if browser is None:
        raise FileNotFoundError("no Chromium on PATH: apt-get install -y chromium")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = subprocess.Popen([browser, *FLAGS, "--user-data-dir=%s" % profile, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its helpers, if any outlived it
                except OSError:
                    pass
    return out.decode(errors="replace")


def screenshot(url: str, png: str, window: str = "1280,2400", timeout: float = 90) -> None:
    _run(["--window-size=%s" % window, "--screenshot=%s" % png, url], timeout)


def dom_after_scripts(url: str, timeout: float = 90) -> str:
    return _run(["--dump-dom", url], timeout)
