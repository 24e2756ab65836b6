"""Makes docs/card.png and docs/card-failure.png: runs a real flow, saves its
@torchrun card as HTML with `card get`, and photographs it with headless Chromium
(Debian: apt-get install -y chromium), offline: the card carries Metaflow's own
Vega bundle, and nothing is fetched.

- docs/card.png: examples/hello, 2 nodes x 2 processes, succeeded.
- docs/card-failure.png: tests/flows/gang_flow.py with stuck.py: node 1's first
  rank waits in a collective nobody else joins, `hang_timeout` stops the gang.

Not part of CI: `python tools/pictures/card_screenshot.py docs` (both), or
`python tools/pictures/card_screenshot.py docs/card.png` (one, by its name)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chromium  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELLO = os.path.join(REPO, "examples", "hello")
TEST_FLOWS = os.path.join(REPO, "tests", "flows")

# name -> (directory, flow file, run arguments, extra environment, window "width,height")
PICTURES: Dict[str, Tuple[str, str, List[str], Dict[str, str], str]] = {
    "card.png": (HELLO, "flow.py", [], {}, "1200,2000"),
    "card-failure.png": (TEST_FLOWS, "gang_flow.py", ["--script", "stuck.py"],
                         {"MFTR_TORCHRUN_ATTRS": json.dumps({"hang_timeout": 6})}, "1200,2300"),
}


def browser() -> str:
    found = chromium.find()
    if found is None:
        sys.exit("no Chromium on PATH: apt-get install -y chromium")
    return found


def card_html(name: str, tmp: str) -> str:
    """Run the picture's flow in a datastore of its own; save the control
    task's card (whose command the control prints) as HTML."""
    directory, flow, args, extra, _ = PICTURES[name]
    env = dict(os.environ, METAFLOW_DATASTORE_SYSROOT_LOCAL=tmp, MFTR_TEST_OUT=os.path.join(tmp, "out"),
               METAFLOW_USER=os.environ.get("METAFLOW_USER", "docs"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), **extra)
    run = subprocess.run([sys.executable, flow, "--no-pylint", "run", *args], cwd=directory, env=env,
                         capture_output=True, text=True, timeout=300)
    found = re.search(r"card view (\S+) --id torchrun", run.stdout + run.stderr)
    if found is None:
        sys.exit("%s printed no card command:\n%s" % (flow, (run.stdout + run.stderr)[-3000:]))
    html = os.path.join(tmp, "card.html")
    subprocess.run([sys.executable, flow, "--no-pylint", "card", "get", found.group(1), "--id", "torchrun", html],
                   cwd=directory, env=env, check=True, capture_output=True, timeout=120)
    return html


def photograph(html: str, out: str, window: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser(), *chromium.FLAGS, "--user-data-dir=%s" % profile, "--window-size=%s" % window,
                        "--screenshot=%s" % os.path.abspath(out), "file://" + html],
                       check=True, capture_output=True, timeout=120)


def make(out: str) -> None:
    name = os.path.basename(out)
    with tempfile.TemporaryDirectory() as tmp:
        photograph(card_html(name, tmp), out, PICTURES[name][4])
    print("wrote %s" % out)


def main(target: str) -> None:
    if os.path.isdir(target):
        for name in PICTURES:
            make(os.path.join(target, name))
    elif os.path.basename(target) in PICTURES:
        make(target)
    else:
        sys.exit("%s: one of %s, or a directory for all" % (target, ", ".join(PICTURES)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "docs"))
