"""Makes the card pictures in docs/: runs a real flow, saves its @torchrun card
as HTML with `card get` (the task and `--hash` the control printed), and
photographs it with headless Chromium (Debian: apt-get install -y chromium),
offline: the card carries Metaflow's own Vega bundle, and nothing is fetched.

- docs/card.png: examples/hello, 2 nodes x 2 processes, succeeded.
- docs/card-failure.png: tests/flows/gang_flow.py with stuck.py: node 1's first
  rank waits in a collective nobody else joins, `hang_timeout` stops the gang.
- docs/card-goodput.png and docs/card-attempts.png: the Goodput and the Attempts
  sections alone, of tests/flows/checkpoint_flow.py's card after node 1's task is
  SIGKILLed past epoch 2's checkpoint and @retry resumes (the card of the last
  attempt, the hash its control printed; both from one run).
- docs/card-restart.png and docs/card-swap.png: the card after an in-step restart in place
  (rank 3 SIGKILLed in the first start) and after a swap (node 1's "bad GPU" kills its ranks; the
  spare, node 2, comes in): every start of the ranks on the timeline, the failed rank in red.
- docs/card-live.png: the control's card while the step still runs (Metaflow's runtime
  render): tests/flows/gang_flow.py with progress_slow.py, rank 3 three times slower,
  taken with `card get` once the refreshed card names the slow node.

Not part of CI: `python tools/pictures/card_screenshot.py docs` (all), or
`python tools/pictures/card_screenshot.py docs/card.png ...` (some, by their names; two
pictures of one run, such as card-goodput.png and card-attempts.png, run it once)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chromium  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELLO = os.path.join(REPO, "examples", "hello")
TEST_FLOWS = os.path.join(REPO, "tests", "flows")

# A run a picture is taken of: (directory, flow file, run arguments, extra environment)
Scenario = Tuple[str, str, List[str], Dict[str, str]]
RETRIED: Scenario = (TEST_FLOWS, "checkpoint_flow.py", [],
                     {"MFTR_CKPT": json.dumps({"kill-after-epoch": 2, "kill-node": 1, "epochs": 3}),
                      "MFTR_RETRY_ON": "infrastructure"})
# name -> (the run, window "width,height", the card's section alone or None for all of it:
# the heading it starts at, up to the next "## ")
PICTURES: Dict[str, Tuple[Scenario, str, Optional[str]]] = {
    "card.png": ((HELLO, "flow.py", [], {}), "1500,3700", None),
    "card-failure.png": ((TEST_FLOWS, "gang_flow.py", ["--script", "stuck.py"],
                          {"MFTR_TORCHRUN_ATTRS": json.dumps({"hang_timeout": 6})}), "1500,4000", None),
    "card-goodput.png": (RETRIED, "1500,640", "## Goodput"),
    "card-attempts.png": (RETRIED, "1500,470", "## Attempts"),
    # restart_resume.py: rank 3 (node 1) SIGKILLs itself in the first start; the gang restarts every
    # node's ranks in place, and they resume from their checkpoint.
    "card-restart.png": ((TEST_FLOWS, "gang_flow.py",
                          ["--script", "restart_resume.py", "--script-args", json.dumps({"fail-at": "0", "steps": 3})],
                          {"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 1})}), "1500,2600", None),
    # Its "bad GPU": node 1's ranks SIGKILL themselves each time they start there; the spare, node 2, is
    # swapped in and resumes.
    "card-swap.png": ((TEST_FLOWS, "gang_flow.py",
                       ["--script", "restart_resume.py", "--nodes", "3", "--script-args",
                        json.dumps({"fail-at": "", "steps": 3, "bad-node": 1})],
                       {"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 1, "spares": 1})}), "1500,2600", None),
}
# The live card: the flow runs this long; its card is taken while it runs.
LIVE = (TEST_FLOWS, "gang_flow.py",
        ["--script", "progress_slow.py", "--script-args", json.dumps({"slow-rank": 3, "seconds": 75, "every": 0.1})],
        {"METAFLOW_TORCHRUN_PROGRESS_SECONDS": "5", "METAFLOW_TORCHRUN_STRAGGLER_SECONDS": "10"}, "1200,1080")
LIVE_NAME = "card-live.png"
# The command the control prints for its attempt's card (the last attempt's is the last printed).
CARD_COMMAND = re.compile(r"card view (\S+) --id torchrun --hash (\w+)")


def browser() -> str:
    found = chromium.find()
    if found is None:
        sys.exit("no Chromium on PATH: apt-get install -y chromium")
    return found


def card_html(scenario: Scenario, tmp: str) -> str:
    """Run the scenario's flow in a datastore of its own; save the card of
    its last attempt, by the task and hash its control printed, as HTML."""
    directory, flow, args, extra = scenario
    env = _env(tmp, extra)
    run = subprocess.run([sys.executable, flow, "--no-pylint", "run", *args], cwd=directory, env=env,
                         capture_output=True, text=True, timeout=300)
    printed = CARD_COMMAND.findall(run.stdout + run.stderr)
    if not printed:
        sys.exit("%s printed no card command:\n%s" % (flow, (run.stdout + run.stderr)[-3000:]))
    task, card_hash = printed[-1]
    html = os.path.join(tmp, "card.html")
    got = subprocess.run([sys.executable, flow, "--no-pylint", "card", "get", task, "--id", "torchrun",
                          "--hash", card_hash, html], cwd=directory, env=env, capture_output=True, text=True,
                         timeout=120)
    if not os.path.exists(html):
        sys.exit("no card %s of %s:\n%s" % (card_hash, task, (got.stdout + got.stderr)[-3000:]))
    return html


def live_card_html(tmp: str) -> str:
    """Run the live picture's flow; while it runs, take the control task's
    card (the task is named in its log lines) until a refresh names the slow
    node; then let the run end."""
    directory, flow, args, extra, _ = LIVE
    env = _env(tmp, extra)
    html = os.path.join(tmp, "card.html")
    with open(os.path.join(tmp, "run.log"), "w+") as log:
        run = subprocess.Popen([sys.executable, flow, "--no-pylint", "run", *args], cwd=directory, env=env,
                               stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            while run.poll() is None:
                time.sleep(3)
                log.seek(0)
                found = re.search(r"\[(\d+/train/\d+) \(pid \d+\)\] @torchrun: progress", log.read())
                if found is None:
                    continue
                subprocess.run([sys.executable, flow, "--no-pylint", "card", "get", found.group(1), "--id", "torchrun",
                                html], cwd=directory, env=env, capture_output=True, text=True, timeout=120)
                if os.path.exists(html) and "slower than the median" in _components(html):
                    return html
            log.seek(0)
            sys.exit("the run ended before its live card named the slow node:\n%s" % log.read()[-3000:])
        finally:
            run.wait(timeout=300)


def _env(tmp: str, extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ, METAFLOW_DATASTORE_SYSROOT_LOCAL=tmp, MFTR_TEST_OUT=os.path.join(tmp, "out"),
               METAFLOW_USER=os.environ.get("METAFLOW_USER", "docs"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""), **extra)
    os.makedirs(env["MFTR_TEST_OUT"], exist_ok=True)  # where the test flows write their notes
    return env


def _components(html: str) -> str:
    with open(html) as f:
        found = re.search(r'window\.__MF_DATA__\["[^"]+"\] = "([A-Za-z0-9+/=]+)"', f.read())
    return base64.b64decode(found.group(1)).decode() if found else ""


def only_section(html: str, heading: str) -> None:
    """Keep, of the card's components, those from ``heading`` to the next
    section: the card's own renderer then draws that section alone."""
    with open(html) as f:
        page = f.read()
    found = re.search(r'(window\.__MF_DATA__\["[^"]+"\] = ")([A-Za-z0-9+/=]+)(")', page)
    if found is None:
        sys.exit("no card data in %s" % html)
    data = json.loads(base64.b64decode(found.group(2)))

    def cut(components: List[dict]) -> bool:
        starts = [i for i, c in enumerate(components)
                  if c.get("type") == "markdown" and str(c.get("source", "")).lstrip().startswith(heading)]
        if starts:
            rest = components[starts[0]:]
            end = next((i for i, c in enumerate(rest) if i and c.get("type") == "markdown"
                        and str(c.get("source", "")).lstrip().startswith("## ")), len(rest))
            components[:] = rest[:end]
            return True
        return any(cut(c["contents"]) for c in components if isinstance(c.get("contents"), list))

    if not cut(data["components"]):
        sys.exit("no %r section in the card" % heading)
    encoded = base64.b64encode(json.dumps(data).encode()).decode()
    with open(html, "w") as f:
        f.write(page[:found.start(2)] + encoded + page[found.end(2):])


def photograph(html: str, out: str, window: str) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser(), *chromium.ONE_PAGE_FLAGS, "--user-data-dir=%s" % profile, "--window-size=%s" % window,
                        "--screenshot=%s" % os.path.abspath(out), "file://" + html],
                       check=True, capture_output=True, timeout=120)


def make(out: str, cards: Dict[str, str]) -> None:
    """Photograph one picture; ``cards`` keeps each run's card, so that two
    pictures of one run run it once."""
    name = os.path.basename(out)
    with tempfile.TemporaryDirectory() as tmp:
        if name == LIVE_NAME:
            photograph(live_card_html(tmp), out, LIVE[4])
            print("wrote %s" % out)
            return
        scenario, window, section = PICTURES[name]
        key = json.dumps(scenario)
        if key not in cards:
            with open(card_html(scenario, tmp)) as f:
                cards[key] = f.read()
        html = os.path.join(tmp, "picture.html")
        with open(html, "w") as f:
            f.write(cards[key])
        if section is not None:
            only_section(html, section)
        photograph(html, out, window)
    print("wrote %s" % out)


def main(targets: List[str]) -> None:
    cards: Dict[str, str] = {}
    for target in targets:
        if os.path.isdir(target):
            for name in [*PICTURES, LIVE_NAME]:
                make(os.path.join(target, name), cards)
        elif os.path.basename(target) in [*PICTURES, LIVE_NAME]:
            make(target, cards)
        else:
            sys.exit("%s: one of %s, or a directory for all" % (target, ", ".join([*PICTURES, LIVE_NAME])))


if __name__ == "__main__":
    main(sys.argv[1:] or [os.path.join(REPO, "docs")])
