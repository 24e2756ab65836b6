"""Hostile text in every field the card shows, drawn by a real browser (headless Chromium).

Every text the card shows that we did not write (host and node names, exception messages,
stacks, a rank's last lines, metric names, preflight checks, goodput and attempt causes,
a checkpoint's metadata, the entrypoint, its arguments and the torchrun command) is filled
with one of a few payloads: markup, scripts and event handlers that would set a global,
text that closes a table or a block, quotes and ``javascript:`` links, Markdown, 3,000
characters without a space, and lone surrogates (bytes that were not UTF-8) with control
characters. Each card is drawn twice, once with the payloads and once with the same text
whose every character but letters, digits and white space is ``_`` (the same lengths and
lines: what the page must look like). Then none of the payloads ran (a trap on the global
and on ``alert``), both pages have the same elements in the same order (no payload became
an element, no table lost or gained a row), the text shown is the same once mapped alike
(every payload shown as its characters, none eaten as markup), every field's name is on
the page (the payloads reached it), and no page is wider than the window.
"""

from __future__ import annotations

import html
import html.parser
import os
import re
import sys
import time
from typing import Callable, List, Tuple

import pytest
import test_card
from test_card import FLOW, _card

import records
from metaflow_extensions.torchrun.plugins.torchrun.card import lifecycle as card_life
from metaflow_extensions.torchrun.plugins.torchrun.card.text import ZWSP
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import ProgressRecord, Straggler
from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import PreflightCheck
from metaflow_extensions.torchrun.plugins.torchrun.gang.node_compare import Finding, JobRecord, PreflightRecord
from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import NONE
from metaflow_extensions.torchrun.plugins.torchrun.procs.culprit import Culprits, Suspect
from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import Attempt, CallStart, Checkpoint, RestartMark
from metaflow_extensions.torchrun.plugins.torchrun.record.goodput import Ledger, Segment
from metaflow_extensions.torchrun.plugins.torchrun.record.in_step_restarts import InStepRestart
from metaflow_extensions.torchrun.plugins.torchrun.record.result import RankRecord, TorchrunResult
from metaflow_extensions.torchrun.plugins.torchrun.record.what_ran import Ran

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "pictures"))
import chromium  # noqa: E402

task = test_card.task  # the fixture: a task of a flow, its card decorator ready

pytestmark = pytest.mark.skipif(chromium.find() is None,
                                reason="no Chromium on PATH (Debian: apt-get install -y chromium)")

# The payloads; ``M`` is the field's name. Each sets the trapped global if it ever runs.
PAYLOADS = {
    "markup": "M <b>b</b><i>i</i><h1>h</h1><script>window.__mftr_pwned='M'</script>"
              "<img src=x onerror=\"window.__mftr_pwned='M'\">",
    "structure": "M </td></tr></tbody></table></pre></details></div><svg onload=\"window.__mftr_pwned='M'\"> "
                 "\"q\" 'q' <a href=\"javascript:window.__mftr_pwned='M'\">a</a> [l](javascript:alert('M'))",
    "markdown": "M **b** _e_ `t` ```\n\n<script>window.__mftr_pwned='M'</script>\n\n# h\n- li\n&lt;i&gt; <javascript:x>",
    "long_and_bytes": "M " + "W" * 3000 + " \udcff\udcfe\x00\x1b[31m\ufffd\u202e\u2028\u0085 \u00e9 \u65e5\u672c",
}
PLAIN = re.compile(r"[^0-9A-Za-z\s]")


def plain(text: str) -> str:
    """The same text, harmless: every character but letters, digits and white space an ``_``."""
    return PLAIN.sub("_", text)


Fill = Callable[[str], str]


def _cause(fill: Fill, kind: CauseKind = CauseKind.HANG) -> Cause:
    return Cause(kind=kind, summary=fill("causesummary"), node_index=1, rank=3, exc_type=fill("causeexctype"),
                 message=fill("causemessage"), traceback=fill("causetraceback"), time=NOW - 2)


NOW = time.time()


def hostile_result(fill: Fill, now: float = NOW) -> TorchrunResult:
    """A failed call of 2 nodes x 2 ranks with ``fill(name)`` in every text the card may show."""
    ranks = [RankRecord(rank=r, local_rank=r, pid=100 + r, start=now - 30, end=now - 2, exit_code=-15)
             for r in (0, 1)]
    other = [dict(rank=r, local_rank=r - 2, pid=200 + r, start=now - 30, end=now - 2, exit_code=-15) for r in (2, 3)]
    lines = [fill("tailstdout"), "a plain line", fill("tailstdout2")]
    gang = records.gang({
        "joined_at": {"0": now - 40, "1": now - 39}, "finished_at": {"0": now - 1, "1": now - 1},
        "reports": {"0": {"ranks": [vars(r) for r in ranks], "tails": {"0": {"stdout": lines}}},
                    "1": {"ranks": other, "tails": {"3": {"stdout": lines, "stderr": [fill("tailstderr")]}}}}})
    stack = 'Current thread 0x1 (most recent call first):\n  File "/work/%s.py", line 3 in %s\n%s' % (
        fill("stackfile"), fill("stackfunction"), fill("stackline"))
    checkpoint = Checkpoint(key=fill("ckptkey"), pathspec=fill("ckptpathspec"), attempt=0,
                            created_on=fill("ckptcreatedon"), metadata={fill("ckptmetakey"): fill("ckptmetavalue")})
    mark = RestartMark(call=0, restart=1, failed_at=now - 20, stopped=fill("markstopped"), swapped_out=1,
                       swapped_in=2, out_host=fill("markouthost"), in_host=fill("markinhost"))
    attempts = [Attempt(0, started_at=now - 100, gang_formed_at=now - 95, calls=(CallStart(0, now - 94),),
                        ended_at=now - 60, stopped=fill("attemptstopped"), recorded_at=now - 59, card=fill("cardhash")),
                Attempt(1, started_at=now - 50, gang_formed_at=now - 41, calls=(CallStart(0, now - 40),),
                        resumed_from=checkpoint, restarts=(mark,))]
    restart = InStepRestart(restart=1, cause=_cause(lambda n: fill("restart" + n)), ran_from=now - 40,
                            failed_at=now - 20, restarted_at=now - 15, swapped_out=1, swapped_in=2)
    segments = (Segment(0, now - 100, now - 60, {"productive": 30.0}, cause=fill("segmentcause")),
                Segment(1, now - 50, now, {"productive": 40.0}, cause=fill("segment2cause")))
    return TorchrunResult(
        command=["torchrun", "--rdzv-backend=" + fill("rdzvbackend"), fill("commandarg")], node_index=0, num_nodes=2,
        nproc_per_node=fill("nprocpernode"), exit_code=-15, started_at=now - 40, ended_at=now,
        main_addr=fill("mainaddr"), local_addr=fill("localaddr"), rdzv_port=29500, gang_port=29501, ranks=ranks,
        cause=_cause(fill), gang=gang, stacks={3: stack, 0: stack.replace("line 3", "line 4")},
        culprits=Culprits(fill("culpritcollective"), (0, 1, 2), (Suspect(3, 1, fill("suspecthost"),
                                                                         fill("suspectwhere"), fill("suspectflight")),),
                          group=fill("culpritgroup"), unread=fill("culpritunread")),
        preflight=_preflight(fill), attempts=attempts, in_step_restarts=[restart], ran=_ran(fill),
        goodput=Ledger(now - 100, now, {"productive": 70.0, "lost_work": 10.0}, segments),
        progress=_progress(fill), role="active", spare_nodes=[2])


def _preflight(fill: Fill) -> PreflightRecord:
    check = PreflightCheck(name=fill("checkname"), status="fail", found=fill("checkfound"),
                           expected=fill("checkexpected"), fix=fill("checkfix"))
    job = JobRecord(backend=fill("jobbackend"), allreduce_ok=True, size_mib=64, home_node=0,
                    link_gbps={0: 10.0, 1: 2.0}, init_s={0: 0.5, 1: 0.7}, slow=(1,))
    return PreflightRecord(mode=fill("preflightmode"), nodes=2, reported=2, differences=(fill("difference"),),
                           findings=(Finding(check, 1, (1,)),),
                           rows=({"node": 1, fill("rowcheck"): fill("rowcell")}, {"node": 0, "disk": "ok"}), job=job)


def _ran(fill: Fill) -> Ran:
    return Ran(entrypoint=fill("entrypoint"), args=[fill("scriptarg"), "--lr=1"], command=(fill("ranargv"), "x.py"),
               log_dir="/logs/" + fill("logdir") + "/node-0", versions={fill("versionname"): fill("versionvalue")})


def _progress(fill: Fill) -> ProgressRecord:
    straggler = Straggler(1, fill("stragglerhost"), fill("stragglerranks"), 0.4, 30.0, "progress")
    return ProgressRecord(step=100, total=1000, percent=10.0, eta_seconds=90.0, steps_per_second=2.0,
                          metrics={fill("metricname"): 0.5}, nodes_reporting=2,
                          slowest={"node_index": 1, "host": fill("slowesthost"), "ranks": fill("slowestranks"),
                                   "ratio": 0.4}, stragglers=(straggler,),
                          chart_groups=("node 0", "node 1"), chart=((0.0, (2.0, 1.0)), (5.0, (2.0, 0.8))))


def refused_result(fill: Fill) -> TorchrunResult:
    """A call refused before any rank started: its reason, what would have run and the attempts."""
    result = hostile_result(fill)
    result.cause = _cause(fill, CauseKind.PREFLIGHT)
    result.ranks, result.exit_code = [], None
    return result


def unread_result(fill: Fill) -> TorchrunResult:
    """No suspect named: why torch's Flight Recorder could not say."""
    result = hostile_result(fill)
    result.culprits, result.flight_unread = None, fill("flightunread")
    return result


SHAPES = {"failed": hostile_result, "refused": refused_result, "unread": unread_result}
# Filled, but on no card: the checkpoint's key and path (its time and metadata are shown), a
# restart's own words (the restart table shows its cause's summary), every cause's type and
# traceback, the torchrun command (read for its rendezvous only; "What ran" shows the recorded one),
# and the recorder's group (named only where the Flight Recorder found the collective).
NEVER_SHOWN = {"ckptkey", "ckptpathspec", "markstopped", "restartcauseexctype", "restartcausemessage",
               "restartcausetraceback", "causeexctype", "causetraceback", "commandarg", "culpritgroup"}
# Shown after another field's text in one cell, so cut where that one is long.
CUT = {"ckptmetakey", "ckptmetavalue", "markinhost", "restartcausesummary"}
CULPRITS = {"culpritcollective", "culpritunread", "suspecthost", "suspectwhere", "suspectflight"}
# What each card shows: a refused call its reason (the cause's message), what would have run and the attempts.
SHOWN_ON_REFUSED = {"causemessage", "entrypoint", "scriptarg", "ranargv", "logdir", "versionname", "versionvalue",
                    "attemptstopped", "cardhash", "ckptcreatedon"}
NOT_SHOWN = {"failed": NEVER_SHOWN | CUT | {"causemessage", "flightunread"},
             "unread": NEVER_SHOWN | CUT | CULPRITS | {"causemessage"}}


def expected_names(shape: str, filled: List[str]) -> set:
    if shape == "refused":
        return SHOWN_ON_REFUSED
    return set(filled) - NOT_SHOWN[shape]



# Put first in the page's head: a trap on the global every payload sets and on alert,
# and, two frames after the load, the page's width against the window's.
TRAP = """<script>
(function () {
  var root = document.documentElement;
  function ran(what) { root.setAttribute("data-ran", (root.getAttribute("data-ran") || "") + what + ";"); }
  Object.defineProperty(window, "__mftr_pwned", {set: ran, get: function () { return undefined; }});
  window.alert = window.confirm = window.prompt = function (what) { ran("alert " + what); };
  addEventListener("load", function () {
    requestAnimationFrame(function () { requestAnimationFrame(function () {
      root.setAttribute("data-widths", root.scrollWidth + " " + window.innerWidth);
      var wide = [], walk = document.createTreeWalker(document.querySelector("main") || document.body, 4);
      while (walk.nextNode() && wide.length < 5) {
        var range = document.createRange();
        range.selectNodeContents(walk.currentNode);
        var right = range.getBoundingClientRect().right;
        if (right > window.innerWidth + 1)
          wide.push(walk.currentNode.parentNode.tagName + " to " + Math.round(right) + "px: " +
                    walk.currentNode.textContent.slice(0, 60));
      }
      root.setAttribute("data-wide", wide.join(" | "));
    }); });
  });
})();
</script>"""


def trapped(page: str) -> str:
    head = page.index("<head>") + len("<head>")
    return page[:head] + TRAP + page[head:]


# Text not compared: scripts and styles, and the charts' (Vega draws its labels from data, as text;
# the timeline shows a host's letters only).
HIDDEN = ("script", "style", "svg")


class _Page(html.parser.HTMLParser):
    """What a page holds under ``<main>``: its elements in order, each table's rows, its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: List[str] = []
        self.rows: List[int] = []
        self.text: List[str] = []
        self.attrs: List[Tuple[str, str]] = []
        self._main = False
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._main = self._main or tag == "main"
        if not self._main:
            return
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        if tag == "table":
            self.rows.append(0)
        elif tag == "tr" and self.rows:
            self.rows[-1] += 1
        self._hidden += tag in HIDDEN

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in HIDDEN and self._hidden > 0

    def handle_data(self, data: str) -> None:
        if self._main and not self._hidden:
            self.text.append(data)


def _shown(page: _Page) -> str:
    """Its text, the invisible breaks and the time it was generated left out."""
    return re.sub(r"Generated [0-9: -]+", "", "".join(page.text).replace(ZWSP, ""))


def first_difference(shown: str, expected: str, around: int = 120) -> str:
    """Where two long texts part, a few lines: pytest's own diff of 80,000 characters takes minutes."""
    at = next((i for i, (a, b) in enumerate(zip(shown, expected)) if a != b), min(len(shown), len(expected)))
    return "they part from the harmless card's at %d:\n  shown:    %r\n  expected: %r" % (
        at, shown[max(0, at - around):at + around], expected[max(0, at - around):at + around])


def read(dom: str) -> _Page:
    page = _Page()
    page.feed(dom)
    return page


@pytest.fixture(scope="module")
def browser():
    with chromium.Browser(window="1920,2000", timeout=180) as b:  # a loaded CI machine: minutes, not seconds
        yield b


def drawn(task, browser, tmp_path, result: TorchrunResult, name: str) -> str:
    """The card of ``result``, rendered in the task as @torchrun renders it, after a browser ran its scripts."""
    assert card_life.finish_card(task.deco, result, FLOW, NONE, 1)
    path = tmp_path / ("%s.html" % name)
    path.write_text(trapped(_card(task).get()), encoding="utf-8")
    return browser.dom_after_scripts("file://%s" % path)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_no_hostile_text_runs_or_breaks_the_card(task, browser, tmp_path, shape, payload):
    names: List[str] = []

    def fill(name: str) -> str:
        names.append(name)
        return PAYLOADS[payload].replace("M", "zq" + name)

    hostile_dom = drawn(task, browser, tmp_path, SHAPES[shape](fill), "hostile")
    plain_dom = drawn(task, browser, tmp_path, SHAPES[shape](lambda name: plain(fill(name))), "plain")
    ran = re.search(r'<html[^>]* data-ran="([^"]*)"', hostile_dom)
    assert ran is None, "a payload ran: %s" % ran.group(1)
    hostile, harmless = read(hostile_dom), read(plain_dom)
    assert hostile.tags and hostile.tags == harmless.tags, "elements made of the text: %s" % first_difference(
        " ".join(hostile.tags), " ".join(harmless.tags))
    assert hostile.rows == harmless.rows, "rows of each table: %s, not %s" % (hostile.rows, harmless.rows)
    shown = _shown(hostile)
    assert plain(shown) == plain(_shown(harmless)), "the text shown: " + first_difference(
        plain(shown), plain(_shown(harmless)))
    widths = re.search(r'<html[^>]* data-widths="(\d+) (\d+)"', hostile_dom)
    wide = re.search(r'<html[^>]* data-wide="([^"]*)"', hostile_dom)
    assert widths and int(widths.group(1)) <= int(widths.group(2)), "the page is %s px wide, the window %s: %s" % (
        widths.group(1), widths.group(2), html.unescape(wide.group(1)) if wide else "?")
    missing = sorted(n for n in expected_names(shape, names) if "zq" + n not in shown)
    assert not missing, "fields filled but not on the card: %s" % missing
