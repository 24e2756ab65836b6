"""The card of each attempt (issue 52), from real runs: the command each
attempt's control prints opens that attempt's card and no other (a 2-node
StepFlow whose control raises after its call in attempt 0; @retry runs attempt
1, which succeeds), and a hang's card names the suspect as the console does."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shlex
import stat
import subprocess
import sys

import pytest

from .helpers import FLOWS, output

pytestmark = pytest.mark.integration

# What the control prints: "@torchrun: this step's card: python ..." at the end
# of its task, or "The card: python ..." at the end of a failed call's error.
_PRINTED = re.compile(r"(?:this step's card|The card): (python (\S+) card view (\S+) (.*?))\s*$", re.M)


def _components(page: str) -> list:
    """Every component of a card page, from the data Metaflow embeds in it."""
    data = re.search(r'__MF_DATA__\["[^"]+"\] = "([^"]+)"', page).group(1)
    out: list = []

    def walk(node):  # in the page's order
        if isinstance(node, dict):
            out.append(node)
            node = list(node.values())
        for child in node if isinstance(node, list) else ():
            walk(child)

    walk(json.loads(base64.b64decode(data)))
    return out


def _title(page: str) -> str:
    return next(c["source"] for c in _components(page) if c.get("type") == "markdown"
                and c.get("source", "").startswith("# "))


def _view(gang, tmp_path, command: str, name: str):
    """``command`` as the control printed it (``python step_flow.py card view
    ...``, the flow's path made absolute), with a "browser" that copies the
    page it is given."""
    browser = tmp_path / ("browser-%s.sh" % name)
    shown = tmp_path / ("shown-%s.html" % name)
    browser.write_text('#!/bin/sh\ncp "${1#file://}" %s\n' % shlex.quote(str(shown)))
    browser.chmod(browser.stat().st_mode | stat.S_IEXEC)
    argv = shlex.split(command)
    assert argv[:2] == ["python", "step_flow.py"], command
    proc = subprocess.run([sys.executable, os.path.join(FLOWS, "step_flow.py")] + argv[2:], cwd=gang.tmp,
                          env=dict(gang.env, BROWSER=str(browser)), stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=120)
    return proc, shown


def test_each_attempts_printed_card_command_opens_that_attempts_card(gang, tmp_path):
    # The control raises after its call in attempt 0: its error is its own, not a call's, so its card's
    # line is the task's, said after that error (Metaflow prints it once the task's hooks are done).
    env = {"MFTR_STEP": json.dumps({"node": {"0": {"raise": "after", "attempt": 0}}}),
           "MFTR_RETRIES": "1", "MFTR_TORCHRUN_ATTRS": "{}"}
    proc = gang.run(flow="step_flow.py", env=env, timeout=240)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    printed = {m.group(1) for m in _PRINTED.finditer(text)}
    assert len(printed) == 2, (printed, text[-4000:])  # one per attempt, each its own
    first = next(_PRINTED.finditer(text))
    assert "RuntimeError: node 0 gave up after" in text[:first.start()], text[-4000:]
    seen, pages = {}, {}
    for i, command in enumerate(sorted(printed)):
        viewed, shown = _view(gang, tmp_path, command, str(i))
        said = output(viewed)
        assert viewed.returncode == 0, said
        assert "card matching" not in said and shown.exists(), said  # one card, opened, no list
        title = _title(shown.read_text())
        attempt = re.search(r"attempt (\d+)", title)
        assert attempt, title
        seen[int(attempt.group(1))] = command
        pages[int(attempt.group(1))] = shown.read_text()
    assert sorted(seen) == [0, 1], seen
    # The last line the run printed is the last attempt's, and opens its card.
    last = list(_PRINTED.finditer(text))[-1].group(1)
    assert seen[1] == last, (seen, last)
    # What docs/seeing-the-gang.md says of the other ways in: the id alone lists
    # both cards; `card list` names both hashes; a hash's first characters open one.
    pathspec = shlex.split(last)[4]
    hashes = {a: shlex.split(c)[-1] for a, c in seen.items()}
    # The last attempt's card names each attempt's card in its Attempts table.
    table = next(c for c in _components(pages[1]) if c.get("type") == "table" and "card (--hash)" in c.get("columns", []))
    column = table["columns"].index("card (--hash)")
    assert [row[column] for row in table["data"]] == [hashes[0][:12], hashes[1][:12]], table
    listed = _card_command(gang, "list", pathspec, "--id", "torchrun")
    assert all(h in listed for h in hashes.values()), listed
    viewed, shown = _view(gang, tmp_path, "python step_flow.py card view %s --id torchrun" % pathspec, "id-only")
    assert "Found 2 card matching" in output(viewed) and not shown.exists(), output(viewed)
    viewed, shown = _view(gang, tmp_path, "python step_flow.py card view %s --hash %s" % (pathspec, hashes[0][:8]),
                          "short")
    assert shown.exists() and "attempt 0" in _title(shown.read_text()), output(viewed)


def _card_command(gang, *args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(FLOWS, "step_flow.py"), "card", *args], cwd=gang.tmp,
                          env=gang.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert proc.returncode == 0, output(proc)
    return output(proc)


def test_a_hangs_card_names_the_suspect_as_the_console_does(gang, tmp_path):
    """One rank skips an all_reduce the other three wait in (tests/flows/
    scripts/skip_collective.py): the console's "Suspected cause" line is on
    the card, at the top and under the root cause, with the suspect's place."""
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"hang_timeout": 20})
    proc = gang.run("--script", "skip_collective.py", timeout=180)
    text = output(proc)
    assert proc.returncode != 0 and "hang_timeout=20s" in text, text[-4000:]
    head = re.search(r"Suspected cause: (rank \d+ is not in the [^\n]*)$", text, re.M)
    suspect = re.search(r"^[^\n]*?(rank \d+ \(node \d+, [^\n]*)$", text[head.end():], re.M) if head else None
    assert head and suspect, text[-4000:]
    command = [m.group(1) for m in _PRINTED.finditer(text)][-1]
    argv = shlex.split(command)
    page = tmp_path / "card.html"
    got = subprocess.run([sys.executable, os.path.join(FLOWS, argv[1])] + ["card", "get"] + argv[4:] + [str(page)],
                         cwd=gang.tmp, env=gang.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert got.returncode == 0 and page.exists(), output(got)
    sources = [c["source"] for c in _components(page.read_text()) if c.get("type") == "markdown"]
    status = html.unescape(sources[0])
    assert "<strong>Suspected cause</strong>: " + head.group(1).strip() in status, (status, head.group(1))
    root = html.unescape(next(s for s in sources if s.startswith("## Root cause")))
    assert "Suspected cause: " + head.group(1).strip() in root and suspect.group(1).strip() in root, root
