"""Makes docs/card.png: runs examples/hello, saves its @torchrun card as HTML with
`card get`, and photographs it with headless Chromium (Debian: apt-get install -y
chromium). Not part of CI: `python tools/pictures/card_screenshot.py docs/card.png`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELLO = os.path.join(REPO, "examples", "hello")


def main(out: str) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("no Chromium on PATH: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, METAFLOW_DATASTORE_SYSROOT_LOCAL=tmp,
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        run = subprocess.run([sys.executable, "flow.py", "--no-pylint", "run"], cwd=HELLO, env=env,
                             capture_output=True, text=True, check=True)
        # The control task prints the command that shows its card; `card get` saves it.
        view = re.search(r"card view (\S+) --id torchrun", run.stdout + run.stderr).group(1)
        html = os.path.join(tmp, "card.html")
        subprocess.run([sys.executable, "flow.py", "--no-pylint", "card", "get", view, "--id", "torchrun", html],
                       cwd=HELLO, env=env, check=True)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,1400", "--screenshot=%s" % os.path.abspath(out), "file://" + html],
                       check=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "docs", "card.png"))
