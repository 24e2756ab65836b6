"""The step's card: the distributed run at a glance.

Built from the ``TorchrunResult`` only, with Metaflow's own card components
(Markdown, Table and VegaChart), so it renders offline like every Metaflow card.
On the control node the result holds the whole gang (every node reports its
ranks and their last lines when it finishes, or once the gang has stopped it);
on other nodes, that node.

Text from ranks is hostile: escaped everywhere (``escape_markdown``,
``text_block``), and bounded: a line is cut at ``CARD_LINE_CHARS`` and wraps
(no line can widen the page), a table cell at ``CARD_CELL_CHARS``, and the rows,
stacks and outputs shown are capped, so a card of 1,024 nodes x 8 ranks stays
small. What is cut is whole in the record and the per-rank logs.

Metaflow renders a card after the task in two ``flow.py card create``
subprocesses (render, then refresh), each importing Metaflow, the flow and this
extension again: about 1 s at the end of every step on 2 cores, 2 s on a GPU
node. This module renders the card in the task itself (10 to 20 ms) with
Metaflow's own card class, card datastore and metadata, so that the Metaflow
client and ``card get/view`` find it exactly as if Metaflow had made it, and
falls back to Metaflow's subprocesses on any error.
"""

from __future__ import annotations

import html
import os
import re
import shlex
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..gang import ProgressRecord, RankStatus
from ..host import log, say
from ..host import cuda_devices
from ..procs import describe_exit_code
from ..launch import Accelerators
from ..procs import stacks
from ..cause import CauseKind
from ..errors import is_refusal
from ..procs import numbers
from . import card_preflight, card_progress, timeline, what_ran
from . import evidence, goodput
from .call_stacks import none_suspected, suspected
from .restarts import swap_words
from .result import REPORT_ARTIFACT, TorchrunResult

CARD_ID = "torchrun"
# A line of a rank's output, stack or error, at most, in the card (it wraps).
CARD_LINE_CHARS = 1000
# A table cell or heading holding text from a rank, at most; a run of more
# than BREAK_EVERY characters without a space gets a place to break.
CARD_CELL_CHARS = 200
BREAK_EVERY = 80
ZWSP = "\u200b"
# The Ranks table's rows, at most: every failed rank, then the lowest ranks.
CARD_RANK_ROWS = 256
# Ranks whose last lines are shown, at most (the failing ones first), and the
# characters of one stream's last lines.
CARD_TAIL_RANKS = 16
CARD_TAIL_CHARS = 8000
# Characters of one rank's stack, and of the root cause, shown.
CARD_STACK_CHARS = 6000
CARD_CAUSE_CHARS = 16000
# Where a rank's whole output is (the gang carries at most 1,000 characters of a
# line, gang/messages.py TAIL_LINE_CHARS, and says so: runtime/call.py).
WHOLE_OUTPUT = "each rank's log files, `rank-N.stdout.log` and `rank-N.stderr.log` in `result.log_dir` on its node"
_CUT_LINE = re.compile(r"… \[\d+ (more )?characters( in all)?\]$", re.M)
# A preformatted block that wraps: a long line breaks instead of widening the
# page (inline style: the card's Markdown keeps raw HTML, and no CSS of ours
# reaches the card otherwise).
_PRE = '<pre style="white-space: pre-wrap; overflow-wrap: anywhere; word-break: break-word; margin: 0">'
# Ranks grouped by place: at most this many places in the card's table.
CARD_PLACES = 50
# Full stacks in the card, at most (a rank's dump is up to 16 KiB; 8,192 of them
# would make a card of 128 MB): the full report holds the rest.
CARD_RANK_STACKS = 64


def _fmt_time(t: Optional[float], origin: float) -> str:
    return "" if t is None else "+%.1f s" % (t - origin)


def _fmt_code(code: Optional[int]) -> str:
    if code is None:
        return "unknown"
    return "0 (ok)" if code == 0 else describe_exit_code(code)


def gang_ranks(result: TorchrunResult) -> Dict[int, List[RankStatus]]:
    """Rank records per node: every node on the control, this node elsewhere."""
    out = {node: list(report.ranks) for node, report in result.gang.reports.items()}
    if result.node_index not in out:
        out[result.node_index] = [r.for_wire() for r in result.ranks]
    return dict(sorted(out.items()))


def gang_tails(result: TorchrunResult) -> Dict[int, Mapping[str, Sequence[str]]]:
    tails: Dict[int, Mapping[str, Sequence[str]]] = {}
    for report in result.gang.reports.values():
        tails.update(report.tails)
    return dict(sorted(tails.items()))


# What the card's Markdown renderer (marked, drawn by svelte-markdown) does with
# text, measured in a real card (tests/integration/test_observability.py): a
# backslash escape is dropped with its character ("\\(x\\)" shows "x"), an
# entity shows as typed ("&lt;"), a code span drops its backticks; an HTML block
# is drawn as HTML, and a table cell as plain text. So text from a rank goes in a
# table cell as it is, in an HTML block escaped as HTML (``text_block``,
# ``html_line``), or in a code span (``escape_markdown``), never bare in Markdown.
_BACKTICK_LOOKALIKE = "\u02cb"
# Text that cannot be markup anywhere in a line (no emphasis, link, autolink,
# entity, HTML or escape character; starting with a letter or digit), shown as it is.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .,;=+%()/-]*")


def escape_markdown(text: Any) -> str:
    """Text we did not write, inline in Markdown (a list item, a heading), as
    a code span: nothing in it is read as Markdown or HTML. Its fence is longer
    than any run of backticks in it; the renderer drops backticks inside a code
    span, so they are shown as a look-alike (U+02CB) rather than lost. Line
    breaks become spaces."""
    flat = " ".join(str(text).splitlines())
    if _PLAIN.fullmatch(flat) and "www." not in flat.lower():
        return flat  # a word or a version: nothing in it can be markup
    flat = flat.replace("`", _BACKTICK_LOOKALIKE)
    return "`` %s ``" % flat if flat.strip() else ""


def html_line(text: Any, limit: int = CARD_CELL_CHARS) -> str:
    """Text we did not write, for one line of an HTML block: cut (``clip``),
    breakable, HTML-escaped."""
    return html.escape(clip(text, limit))


def clip(text: Any, limit: int = CARD_CELL_CHARS) -> str:
    """Text we did not write as one line of at most ``limit`` characters (and a
    count of what was cut), for a table cell, a heading, a summary: where the
    browser can break it (``breakable``), so it wraps rather than widen the page."""
    flat = " ".join(str(text).splitlines())
    if len(flat) > limit:
        flat = "%s… [%d more characters]" % (flat[:limit], len(flat) - limit)
    return breakable(flat)


_RUN = re.compile(r"[^\s\u200b]{%d}" % BREAK_EVERY)


def breakable(text: str) -> str:
    """A zero-width space after every ``BREAK_EVERY`` characters without a
    space (a path, a long identifier): a line break opportunity, invisible."""
    return _RUN.sub(lambda m: m.group(0) + ZWSP, text)


def clip_lines(text: Any, total: int, line_limit: int = CARD_LINE_CHARS, keep: str = "head") -> Tuple[str, bool]:
    """Text we did not write, each line cut at ``line_limit`` characters and
    the whole at about ``total``: its first lines (``keep="head"``: a stack,
    innermost first) or its last (``"tail"``: output). True when anything was cut."""
    lines = str(text).splitlines()
    cut = False
    out = []
    for line in lines:
        if len(line) > line_limit:
            line = "%s… [%d more characters]" % (line[:line_limit], len(line) - line_limit)
            cut = True
        out.append(line)
    kept: List[str] = []
    size = 0
    for line in (out if keep == "head" else reversed(out)):
        size += len(line) + 1
        if size > total and kept:
            cut = True
            break
        kept.append(line)
    if keep != "head":
        kept.reverse()
    if len(kept) < len(out):
        note = "… [%d more lines]" % (len(out) - len(kept))
        kept = kept + [note] if keep == "head" else [note] + kept
    return "\n".join(kept), cut


def _sentence(notes: List[str]) -> str:
    text = "; ".join(notes)
    return text[:1].upper() + text[1:]


def text_block(text: Any) -> str:
    """``text`` verbatim (HTML-escaped) in a preformatted block that wraps long
    lines, on one line of Markdown: its line breaks are written ``&#10;``, so the
    HTML block can neither end early (at a blank line) nor be split by the
    renderer (a carriage return), and a ``<details>`` around it holds it."""
    lines = str(text).splitlines()
    return "%s%s</pre>" % (_PRE, "&#10;".join(html.escape(line) for line in lines))


def code_block(text: Any) -> str:
    """``text`` verbatim in a fenced code block whose fence no line of it can
    close: longer than the longest run of backticks it holds."""
    body = str(text)
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return "%s\n%s\n%s" % (fence, body, fence)


def card_view_command(argv0: str, deco: Any, pathspec: str) -> Optional[str]:
    """The command that opens this attempt's card (``deco``'s, None on a node
    without one), and only it: the control task's pathspec (``card view
    <step>`` alone picks any node's task, mostly one without the card) and the
    card's hash. Every attempt of a task keeps its own card under the same id,
    so after a ``@retry`` the id alone matches each attempt's, and Metaflow
    then lists them instead of showing one."""
    if deco is None:
        return None
    card_uuid = getattr(deco, "_card_uuid", None)  # set by the card's task_pre_step
    run_step_task = "/".join(pathspec.split("/")[1:])
    command = "python %s card view %s --id %s" % (
        shlex.quote(os.path.basename(argv0) or "flow.py"), run_step_task, CARD_ID)
    return command + (" --hash %s" % card_uuid if card_uuid else "")


def this_card_hash() -> Optional[str]:
    """This task's @torchrun card's hash (Metaflow's uuid for it), for the
    attempt's record: None where the step has none (``card=False``), or
    before Metaflow has set up ``current.card``."""
    from metaflow import current

    try:
        uuid = getattr(current.card, "_card_id_map", {}).get(CARD_ID)
    except Exception:  # no card on this step, or a Metaflow that keeps cards otherwise
        return None
    return uuid if isinstance(uuid, str) else None


def title_markdown(flow: str, pathspec: str, attempt: int) -> str:
    """The card's heading: the flow, the task, and which attempt this card is
    of (each attempt of a task has a card of its own)."""
    # A flow's name is a Python identifier; the pathspec is Metaflow's (flow/run/step/task).
    name = flow if flow.isidentifier() else escape_markdown(flow)
    return "# @torchrun: %s, attempt %d\n\n`%s` (attempt %d)" % (name, attempt, pathspec, attempt)


def summary_markdown(result: TorchrunResult, flow: str, pathspec: str, attempt: int = 0) -> str:
    if result.succeeded:
        status = "**Succeeded** in %.1f s" % result.duration
    else:
        summary = result.cause.summary if result.cause is not None else None
        # An HTML block, one line: the cause's text exactly as it is.
        status = "<p><strong>Failed</strong>: %s</p>" % html_line(summary or _fmt_code(result.exit_code))
        suspects = suspected(result.culprits, result.cause)
        if suspects:  # the console's first line of it, as it says it, and the first suspect it names
            head = " ".join([suspects[0].split(": ", 1)[-1]] + [line.strip() for line in suspects[1:2]])
            status += "<p><strong>Suspected cause</strong>: %s</p>" % html_line(head, CARD_LINE_CHARS)
    return "%s\n\n%s" % (title_markdown(flow, pathspec, attempt), status)


def topology_rows(result: TorchrunResult, backend: str) -> List[List[str]]:
    return [
        ["nodes x processes", "%d x %s" % (result.num_nodes, result.nproc_per_node)],
        ["control address", str(result.main_addr)],
        ["this node's address", str(result.local_addr)],
        ["rendezvous port (%s)" % rendezvous_backend(result.command), str(result.rdzv_port)],
        ["gang service port", str(result.gang_port)],
        ["backend", backend],
        ["restarts", str(result.restarts)],
        ["this node", str(result.node_index)],
    ] + bench_rows(result)


def bench_rows(result: TorchrunResult) -> List[List[str]]:
    """With spares (``@torchrun(spares)``): this node's part at the call's end
    and the nodes that sat it out (at most the step's spares)."""
    if result.role == "active" and not result.spare_nodes and not result.out_nodes:
        return []
    def listed(nodes: List[int]) -> str:
        return ", ".join(map(str, nodes)) or "none"
    return [["this node's role", result.role], ["spares left", listed(result.spare_nodes)],
            ["taken out", listed(result.out_nodes)]]


def rendezvous_backend(command: List[str]) -> str:
    """The rendezvous the call's torchrun used, as its command says (static
    unless ``max_restarts``): the card names the one that ran."""
    for i, arg in enumerate(command or []):
        if arg.startswith("--rdzv-backend="):
            return arg.split("=", 1)[1]
        if arg == "--rdzv-backend" and i + 1 < len(command):
            return command[i + 1]
    return "unknown"


def timeline_parts(result: TorchrunResult, Markdown: Any) -> list:
    """The chart (timeline.py), or a line saying why there is none."""
    try:
        from metaflow.cards import VegaChart
    except ImportError:  # Metaflow before VegaChart
        return [Markdown("## Timeline"), Markdown("_This Metaflow's cards have no chart component._")]
    gang = timeline.from_result(result, gang_ranks(result))
    parts = [Markdown("## Timeline"), VegaChart(timeline.spec(gang))]
    notes = timeline.captions(gang)
    if notes:
        parts.append(Markdown("_%s; the Ranks table below has every rank._" % _sentence(notes)))
    return parts


def shown_ranks(ranks: List[Tuple[int, RankStatus]], limit: int) -> List[Tuple[int, RankStatus]]:
    """At most ``limit`` of (node, rank record), in rank order: every rank
    that failed (not stopped by the gang) first, then the lowest ranks."""
    if len(ranks) <= limit:
        return ranks
    failed = [i for i, (_, r) in enumerate(ranks)
              if timeline.rank_state(r, None) == "rank: failed"][:limit]
    rest = [i for i in range(len(ranks)) if i not in set(failed)][: limit - len(failed)]
    return [ranks[i] for i in sorted(failed + rest)]


def rank_rows(result: TorchrunResult, limit: int = CARD_RANK_ROWS) -> List[List[str]]:
    every = [(node, r) for node, ranks in gang_ranks(result).items() for r in ranks]
    every.sort(key=lambda nr: (nr[1].rank, nr[0]))
    rows = []
    for node, r in shown_ranks(every, limit):
        start, end = r.start, r.end
        rows.append(
            [
                str(r.rank),
                str(node),
                str(r.local_rank),
                str(r.pid),
                _fmt_code(r.exit_code),
                "%.1f s" % (end - start) if start and end else "",
            ]
        )
    if len(every) > len(rows):
        rows.append(["%d more ranks" % (len(every) - len(rows)), "", "", "", "", ""])
    return rows


def stack_parts(result: TorchrunResult, Markdown: Any, Table: Any) -> list:
    """Where the ranks were when the job was stopped: the places, ranks grouped
    (odd ones out first), then each rank's full stack in a collapsed section,
    for the first ``CARD_RANK_STACKS`` ranks in that order; the artifact
    ``REPORT_ARTIFACT`` holds every rank's."""
    if not result.stacks:
        return []
    groups = stacks.group(result.stacks)
    rows = [[clip(numbers(ranks)), str(len(ranks)), " / ".join(clip(line.strip()) for line in place)]
            for place, ranks in groups[:CARD_PLACES]]
    if len(groups) > CARD_PLACES:
        rest = groups[CARD_PLACES:]
        rows.append(["%d more places" % len(rest), str(sum(len(r) for _, r in rest)), ""])
    order = [rank for _, ranks in groups for rank in ranks]
    shown = order[:CARD_RANK_STACKS]
    parts = [
        Markdown("## Where the ranks were when the job was stopped"),
        Table(rows, headers=["ranks", "count", "where (innermost frame of your code first)"]),
        Markdown("Each rank's stack (%d of %d shown, odd ones out first, each up to %s characters; every rank's "
                 "whole in the artifact `%s` of node 0's task):"
                 % (len(shown), len(order), format(CARD_STACK_CHARS, ","), REPORT_ARTIFACT)),
    ]
    for rank in shown:
        text = result.stacks[rank].rstrip()
        head = " / ".join(clip(line.strip()) for line in stacks.where(rank, text).lines())
        body, _ = clip_lines(text, CARD_STACK_CHARS)
        # One HTML block, one line (text_block): the stack inside the collapsed section.
        parts.append(Markdown("<details><summary>%s</summary>%s</details>" % (html.escape(head), text_block(body))))
    return parts


def attempt_rows(result: TorchrunResult) -> List[List[str]]:
    """Every attempt of the step (runtime/attempts.py), times from the first
    attempt's start, and what each failure cost."""
    rows: List[List[str]] = []
    attempts = result.attempts
    if len(attempts) < 2:
        return rows
    origin = attempts[0].started_at or 0.0

    def secs(value: Optional[float]) -> str:
        return "%.1f s" % value if value is not None else ""

    for a in attempts:
        calls = ", ".join(_fmt_time(c.started_at, origin) for c in a.calls)
        resumed = a.resumed_from
        meta = (resumed.metadata if resumed is not None else None) or {}
        label = ("%s (%s)" % (resumed.created_on, ", ".join("%s=%s" % kv for kv in sorted(meta.items())))
                 if resumed is not None else "")
        rows.append([
            str(a.attempt), _fmt_time(a.started_at, origin), secs(a.gang_formed_seconds),
            calls, clip(a.stopped or ""), clip(label),
            secs(a.lost_work_seconds), secs(a.restart_seconds), (a.card or "")[:CARD_HASH_SHOWN],
        ])
    return rows


def evidence_markdown(pathspec: str, result: TorchrunResult) -> str:
    """Where this attempt's evidence bundle is (runtime/evidence.py), and the
    previous attempt's, to compare."""
    attempt = result.attempts[-1].attempt if result.attempts else 0
    line = "Evidence (grouped stacks, every rank's last lines, NCCL Flight Recorder dumps, `nvidia-smi -q` of " \
           "the failing node where present): artifact `%s` of this task, `Task(%r, attempt=%d)['%s'].data`" % (
               evidence.ARTIFACT, pathspec, attempt, evidence.ARTIFACT)
    if attempt > 0:
        line += "; the previous attempt's: `attempt=%d`" % (attempt - 1)
    return line + "."


def goodput_parts(result: TorchrunResult, Markdown: Any, Table: Any) -> list:
    """The goodput ledger (runtime/goodput.py): effective training time, one
    bar per attempt, and the seconds of each part."""
    led = result.goodput
    if led is None:
        return []
    parts = [Markdown("## Goodput\n\n%s" % escape_markdown(led.summary())),
             Markdown(GOODPUT_PARTS)]
    try:
        from metaflow.cards import VegaChart

        parts.append(VegaChart(goodput.bar_spec(led)))
    except ImportError:  # an older Metaflow: the table says it
        pass
    # The cause column is a rank's own text: clipped and breakable, as every cell here.
    parts.append(Table([row[:-1] + [clip(row[-1])] for row in goodput.rows(led)], headers=goodput.HEADERS))
    return parts


GOODPUT_PARTS = ("Each attempt's wall time cut into parts that never overlap: _lost work_ is training redone "
                 "after a failure, _stop_ the failure to the control's record, _restart_ the record to the next "
                 "attempt's first line (Metaflow's retry, the new gang's start).")
ATTEMPT_HEADERS = ["attempt", "started", "gang formed in", "calls started", "stopped", "resumed from",
                   "lost work", "failure to next first line", "card (--hash)"]
# A card's hash in the Attempts table: its first characters, enough for `--hash`.
CARD_HASH_SHOWN = 12
# What the two costs count, said under the table: the Goodput table cuts the
# same time at the same marks (runtime/attempts.py with_costs, runtime/goodput.py).
ATTEMPT_COSTS = ("_Lost work_: training since the checkpoint the next attempt resumed from (since the first line "
                 "without one) up to the failure, as in the Goodput table. _Failure to next first line_: from the "
                 "failure to the next attempt's first line, which the Goodput table splits into this attempt's "
                 "_stop_ and _restart_ and the next attempt's _restart_. _Card_: that attempt's card, opened "
                 "with `card view <run>/<step>/<task> --hash <card>`.")


def restart_rows(result: TorchrunResult) -> List[List[str]]:
    """The call's in-step restarts (runtime/restarts.py), counted like attempts:
    times from the call's start, what each cost."""
    def secs(value: Optional[float]) -> str:
        return "%.1f s" % value if value is not None else ""

    return [[str(r.restart), _fmt_time(r.failed_at, result.started_at), clip(restart_cause(result, r)),
             secs(r.lost_work_seconds), secs(r.restart_seconds)] for r in result.in_step_restarts[-CARD_RANK_ROWS:]]


def restart_cause(result: TorchrunResult, r: Any) -> str:
    """A restart's cause; a swap's (``@torchrun(spares)``) after the nodes it
    swapped, with their hosts from the attempt's record (the control's)."""
    if r.swapped_out is None or r.swapped_in is None:
        return r.cause.summary
    marks = {(m.call, m.restart): m for m in (result.attempts[-1].restarts if result.attempts else ())}
    mark = marks.get((result.call, r.restart))
    swap = mark.swap if mark is not None and mark.swap else swap_words(r.swapped_out, r.swapped_in, {})
    return "%s: %s" % (swap, r.cause.summary)


RESTART_HEADERS = ["restart", "failed at", "cause", "work lost (at most)", "back to your script in"]


def tail_parts(result: TorchrunResult, Markdown: Any) -> list:
    """The last lines of each rank's output: at most ``CARD_TAIL_RANKS`` ranks
    (the root cause's rank, then failed ranks, then the lowest), each stream's
    last ``CARD_TAIL_CHARS`` characters, lines cut at ``CARD_LINE_CHARS``."""
    tails = {rank: streams for rank, streams in gang_tails(result).items()
             if any(streams.get(s) for s in ("stdout", "stderr"))}
    if not tails:
        return []
    failed = {r.rank for ranks in gang_ranks(result).values() for r in ranks
              if timeline.rank_state(r, None) == "rank: failed"}
    root = result.cause.rank if result.cause is not None else None
    order = sorted(tails, key=lambda rank: (rank != root, rank not in failed, rank))[:CARD_TAIL_RANKS]
    parts = [Markdown("## Last lines of each rank")]
    cut = False
    for rank in sorted(order, key=lambda rank: (rank != root, rank)):
        for stream in ("stdout", "stderr"):
            lines = tails[rank].get(stream) or []
            if lines:
                body, clipped = clip_lines("\n".join(lines), CARD_TAIL_CHARS, keep="tail")
                cut = cut or clipped or bool(_CUT_LINE.search(body))
                parts.append(Markdown("**rank %d %s**\n\n%s" % (rank, stream, text_block(body))))
    notes = []
    if len(tails) > len(order):
        notes.append("%d of %d ranks shown (the failing ones first)" % (len(order), len(tails)))
    if cut:
        notes.append("long lines are cut, saying how long they were")
    if notes:
        parts.append(Markdown("_%s; the whole of every rank's output: %s._" % (_sentence(notes), WHOLE_OUTPUT)))
    return parts


def refusal_reason(result: TorchrunResult) -> Optional[str]:
    """Why a call was refused before any rank started, or None: such a card
    shows no empty tables and no checks that were not run."""
    cause = result.cause
    if cause is None or not (is_refusal(cause) or cause.kind is CauseKind.PREFLIGHT):
        return None
    if result.ranks or result.exit_code is not None:
        return None
    return cause.message or cause.summary


def what_ran_parts(result: TorchrunResult, Markdown: Any, Table: Any) -> list:
    """The "what ran" section (what_ran.py)."""
    # A table cell is drawn as text: clipped, never escaped (an entity would show as typed).
    rows = [[clip(k), clip(v, CARD_LINE_CHARS)] for k, v in what_ran.rows(result.ran, result.num_nodes)]
    return [Markdown("## What ran"), Table(rows, headers=["", ""])] if rows else []


def refused_components(result: TorchrunResult, flow: str, pathspec: str, reason: str, attempt: int = 0) -> list:
    from metaflow.cards import Markdown, Table

    parts = [Markdown(title_markdown(flow, pathspec, attempt)),
             Markdown("**Refused before any rank started:**\n\n%s" % text_block(clip_lines(reason, CARD_CAUSE_CHARS)[0]))]
    parts += what_ran_parts(result, Markdown, Table)
    if attempt_rows(result):
        parts += [Markdown("## Attempts"), Table(attempt_rows(result), headers=ATTEMPT_HEADERS)]
    parts.append(Markdown("_Generated %s_" % time.strftime("%Y-%m-%d %H:%M:%S")))
    return parts


def build_components(result: TorchrunResult, flow: str, pathspec: str, backend: str, attempt: int = 0) -> list:
    from metaflow.cards import Markdown, Table

    reason = refusal_reason(result)
    if reason is not None:
        return refused_components(result, flow, pathspec, reason, attempt)
    parts = [
        Markdown(summary_markdown(result, flow, pathspec, attempt)),
        *card_progress.parts(result.progress, escape_markdown, clip, Markdown, Table),
        *what_ran_parts(result, Markdown, Table),
        Markdown("## Topology"),
        Table(topology_rows(result, backend), headers=["", ""]),
    ]
    parts += timeline_parts(result, Markdown)
    parts += [
        Markdown("## Ranks"),
        Table(rank_rows(result), headers=["rank", "node", "local rank", "pid", "exit", "duration"]),
    ]
    if attempt_rows(result):
        parts += [Markdown("## Attempts"), Table(attempt_rows(result), headers=ATTEMPT_HEADERS), Markdown(ATTEMPT_COSTS)]
    if result.in_step_restarts:
        parts += [Markdown("## Restarts in the step"), Table(restart_rows(result), headers=RESTART_HEADERS)]
    parts += goodput_parts(result, Markdown, Table)
    cause = result.cause
    if cause is not None:
        # The suspects (procs/culprit.py) as the failure says them: by rank, node, host and place.
        said = suspected(result.culprits, cause) or none_suspected(result.culprits, result.flight_unread, cause)
        text, _ = clip_lines("\n\n".join([cause.summary] + ["\n".join(said)]).strip(),
                             CARD_CAUSE_CHARS)
        parts.append(Markdown("## Root cause\n\n%s" % text_block(text)))
        parts.append(Markdown(evidence_markdown(pathspec, result)))
    parts.extend(stack_parts(result, Markdown, Table))
    parts.extend(card_preflight.parts(result.preflight, escape_markdown, code_block))
    parts.extend(tail_parts(result, Markdown))
    parts.append(Markdown("_Generated %s_" % time.strftime("%Y-%m-%d %H:%M:%S")))
    return parts


# -- Metaflow card glue: the decorator's hooks call these --------------------


def attach_card(decorators) -> Optional[Any]:
    """Add ``@card(type="blank", id="torchrun")`` to the step unless present."""
    try:
        from metaflow.plugins.cards.card_decorator import CardDecorator
    except ImportError:
        return None
    for deco in decorators:
        if isinstance(deco, CardDecorator) and deco.attributes.get("id") == CARD_ID:
            return deco
    deco = CardDecorator(attributes={"type": "blank", "id": CARD_ID})
    if hasattr(deco, "external_init"):  # Metaflow 2.16+; before, __init__ did it all
        deco.external_init()
    # Metaflow is iterating this very list to call step_init: the card's own
    # step_init runs right after ours.
    decorators.append(deco)
    return deco



def backend_label(accelerators: Accelerators, cuda_count: Optional[int]) -> str:
    """The process-group backend to expect. The script picks it, not us: say
    what the step asked for rather than guess from the machine (a CPU job on a
    GPU node runs gloo)."""
    n = accelerators.count
    if accelerators.kind == "gpu":
        asked = "the step asked for %d GPU%s" % (n, "" if n == 1 else "s")
        if cuda_count == 0:
            return "gloo expected (%s, but no CUDA device is visible)" % asked
        return "nccl expected (%s)" % asked
    if accelerators.kind == "neuron":
        return "chosen by the script (the step asked for %d Neuron device%s)" % (n, "" if n == 1 else "s")
    return "gloo expected (the step asked for no GPU)"


def fill_card(result: TorchrunResult, flow_name: str, accelerators: Accelerators, attempt: int = 0) -> bool:
    """Put the run's components into ``current.card["torchrun"]``; False (and
    one line on stderr) where it could not: a card must never fail the step."""
    from metaflow import current

    try:
        card = current.card[CARD_ID]
        card.clear()
        backend = backend_label(accelerators, cuda_devices(os.environ))
        card.extend(build_components(result, flow_name, current.pathspec, backend, attempt))
        return True
    except Exception as e:
        say("could not build the card: %s" % e)
        return False


def refresh_live(progress: ProgressRecord, flow_name: str) -> None:
    """While a call runs on the control: the card's progress section, through
    Metaflow's own runtime refresh (``current.card[...].refresh``, rendered
    by Metaflow in the background); the final card replaces it. Never raises."""
    from metaflow import current
    from metaflow.cards import Markdown, Table

    try:
        card = current.card[CARD_ID]
        card.clear()
        card.extend([
            Markdown(title_markdown(flow_name, current.pathspec, int(current.retry_count or 0))),
            Markdown("_Running: refreshed %s while the step runs; the whole card comes when it ends._"
                     % time.strftime("%Y-%m-%d %H:%M:%S")),
            *card_progress.parts(progress, escape_markdown, clip, Markdown, Table),
        ])
        card.refresh(force=True)
    except Exception as e:  # a card must never fail the step
        log.get("card").debug("live card not refreshed: %s", e)


def finish_card(deco: Any, result: TorchrunResult, flow_name: str, accelerators: Accelerators, attempt: int) -> bool:
    """Fill the card and render it in this process, in place of Metaflow's
    ``card create`` subprocesses at the end of the task. False where Metaflow
    must still render it: the card is filled either way."""
    if not fill_card(result, flow_name, accelerators, attempt):
        return False
    return render_in_task(deco, attempt)


def card_ready(deco: Any) -> bool:
    """Whether the card decorator got as far as its own ``task_pre_step`` (a
    step refused before it, by our checks or another decorator's, has no card
    to render and none to name)."""
    return getattr(deco, "_card_uuid", None) is not None and getattr(deco, "card_creator", None) is not None


def render_card_now(deco: Any, attempt: int) -> bool:
    """Metaflow renders cards of successful tasks only; the card of a failed
    run is the one that matters most. In this process where possible, else with
    Metaflow's own ``card create`` subprocess. False, and nothing said, when
    there is no card to render; one plain line when rendering it failed."""
    if not card_ready(deco):
        return False
    _title_if_empty(attempt)
    if render_in_task(deco, attempt):
        return True
    try:
        deco.card_creator.create(
            mode="render",
            final=True,
            card_uuid=deco._card_uuid,
            user_set_card_id=deco._user_set_card_id,
            runtime_card=deco._is_runtime_card,
            decorator_attributes=deco.attributes,
            card_options=deco.card_options,
            logger=deco._logger,
            sync=True,
        )
        return True
    except Exception as e:
        say("could not render the card of the failed task: %s" % e)
        return False


def _title_if_empty(attempt: int) -> None:
    """A card with nothing in it (the step failed before any record: its
    gang never formed) still says whose it is: the task and the attempt."""
    from metaflow import current
    from metaflow.cards import Markdown

    try:
        card = current.card[CARD_ID]
        if len(card.components) == 0:
            card.extend([Markdown(title_markdown(current.flow_name, current.pathspec, attempt)),
                         Markdown("_The step failed before its gang formed: no record of a call._")])
    except Exception as e:  # a card must never fail the step
        log.get("card").debug("no title for the empty card: %s", e)


# -- Rendering in the task ----------------------------------------------------
#
# What ``card create`` does (metaflow/plugins/cards/card_cli.py), without the
# subprocess: instantiate the card class with the serialized components, render
# it with the reload token of a final render, save the HTML and the refresh data
# with CardDatastore under the card root, and register the card's "card-info"
# metadata (Metaflow 2.16+ only; older versions write none).

_FAILED_ATTR = "_torchrun_in_task_render_failed"


class _TaskView:
    """What a blank card's ``render`` reads of its task: the pathspec. The
    subprocess builds a client ``Task`` for it, a metadata round trip."""

    finished = True

    def __init__(self, pathspec: str) -> None:
        self.pathspec = pathspec


def render_in_task(deco: Any, attempt: int) -> bool:
    """Render ``deco``'s card here and stop Metaflow from rendering it again.
    True when done; on any error False (Metaflow's path then stays in place),
    with one line on stderr the first time."""
    if getattr(deco, _FAILED_ATTR, False):
        return False
    try:
        _check_renderable(deco)
        _render_and_save(deco, attempt)
        skip_render(deco)
        return True
    except Exception as e:
        setattr(deco, _FAILED_ATTR, True)
        say("rendering the card in the task failed (%s: %s); Metaflow renders it" % (type(e).__name__, e))
        return False


def _check_renderable(deco: Any) -> None:
    """Refuse before writing anything what this module cannot do as Metaflow
    would: another card type (a user's own ``@card(id="torchrun")``), or a
    Metaflow whose task calls ``task_finished_ctx`` rather than ``task_finished``."""
    card_type = deco.attributes.get("type")
    if card_type != "blank":
        raise ValueError("card type %r is not rendered in the task" % card_type)
    if getattr(deco, "task_finished_ctx", None) is not None:
        raise ValueError("this Metaflow finishes cards with task_finished_ctx")
    for name in ("_card_uuid", "_flow_datastore", "_metadata"):
        if getattr(deco, name, None) is None:
            raise ValueError("the card decorator has no %s" % name)


def _render_and_save(deco: Any, attempt: int) -> None:
    from metaflow import current
    from metaflow.plugins import CARDS

    uuid, card_type, card_id = deco._card_uuid, deco.attributes["type"], deco._user_set_card_id
    classes = [c for c in CARDS if c.type == card_type]
    if not classes:
        raise ValueError("no card class of type %r" % card_type)
    components = current.card._serialize_components(uuid)
    options = deco.card_options
    # As `card create`: options only when there are some (the class has defaults).
    card = classes[0](options=options, components=components, graph=None) if options else classes[0](
        components=components, graph=None
    )
    task = _TaskView(current.pathspec)
    # A final render's reload token is "final" whatever the card's policy.
    html = card.render(task).replace(card.RELOAD_POLICY_TOKEN, "final")
    if not html:
        raise ValueError("the card rendered nothing")
    _wait_for_runtime_renders(deco)
    store = _card_datastore(deco._flow_datastore, current.pathspec)
    store.save_card(uuid, card_type, html, card_id=card_id)
    refreshed = card.refresh(task, current.card._get_latest_data(uuid, final=True, mode="refresh"))
    if refreshed is not None:
        payload = {"reload_token": "final", "data": refreshed, "created_on": time.time()}
        store.save_data(uuid, card_type, payload, card_id=card_id)
    _register_card_info(deco, attempt)


def _wait_for_runtime_renders(deco: Any) -> None:
    """A ``current.card.refresh()`` in the step starts an asynchronous
    ``card create`` of the runtime card; one still running could overwrite the
    final card after us. Metaflow waits for it before its final render: so do we
    (no wait when there is none, the usual case)."""
    wait = getattr(deco.card_creator, "_wait_for_async_processes_to_finish", None)
    if wait is not None:
        timeout = deco.attributes.get("timeout")
        wait(deco._card_uuid, 30 if timeout is None else int(timeout) + 10)


def _card_datastore(flow_datastore: Any, pathspec: str) -> Any:
    """A CardDatastore where ``card create`` saves: the card root of the task's
    datastore type (``mf.cards`` beside the local datastore; CARD_S3ROOT...),
    else the task's datastore root. A storage object of its own: ``card
    create`` re-roots its storage, which here is the task's."""
    from metaflow.datastore import FlowDataStore
    from metaflow.plugins.cards.card_datastore import CardDatastore

    impl = flow_datastore._storage_impl
    root = CardDatastore.get_storage_root(impl.TYPE) or flow_datastore.datastore_root
    cards = FlowDataStore(flow_datastore.flow_name, None, storage_impl=type(impl), ds_root=root)
    return CardDatastore(cards, pathspec=pathspec)


def _register_card_info(deco: Any, attempt: int) -> None:
    """The "card-info" metadata Metaflow registers once per card (the UI lists
    cards by it), through the same once-only guard as Metaflow's."""
    should_save = getattr(deco.card_creator, "_should_save_metadata", None)
    if should_save is None:
        return  # Metaflow before 2.16 registers no card metadata
    save, info = should_save(deco._card_uuid)
    if not save:
        return
    from metaflow import current
    from metaflow.plugins.cards.metadata import _save_metadata

    _save_metadata(
        deco._metadata, current.run_id, current.step_name, current.task_id, attempt, deco._card_uuid, info
    )


def card_of_task(deco: Any, is_control: bool) -> Any:
    """The card decorator this task renders: the control's only, since it
    sees the whole gang. Rendering one on every other node would cost each a
    Metaflow start-up on its critical path. The card decorator stays on the
    step's list: Metaflow counted it at step_init and finalises current.card
    only once every counted card has been through task_pre_step, so taking
    it off would break every other card of the step (a user's @card,
    @model's) on this node. Only its render is skipped."""
    if deco is None or is_control:
        return deco
    skip_render(deco)
    return None


def skip_render(deco: Any) -> None:
    """Metaflow calls the card decorator's ``task_finished`` after ours and
    renders the card there. Removing the decorator from the step's list while
    Metaflow iterates that list (for task_post_step or task_exception) would
    make it skip the decorator after ours whenever the card sits before ours;
    shadowing the one hook is safe wherever it sits, and keeps its clean-up
    (the config file it shares with the step's other cards)."""
    cleanup = getattr(deco, "_cleanup", None)

    def task_finished(step_name, *args, **kwargs):
        if cleanup is not None:
            cleanup(step_name)

    deco.task_finished = task_finished
