"""The card's content: the distributed run at a glance, from the ``TorchrunResult`` alone, with
Metaflow's own card components, so it renders offline. Text from ranks is hostile (``card/text.py``
escapes and bounds it); rows, stacks and outputs are capped, so a card of 1,024 nodes x 8 ranks
stays small; what is cut is whole in the record and the per-rank logs.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.cards import Markdown, Table

from ..gang.messages import RankStatus
from ..procs.failures import describe_exit_code
from ..launch import Accelerators
from ..procs import stacks
from ..base.text import count
from ..cause import CauseKind
from ..errors import is_refusal, not_restarted
from ..procs.ranges import numbers
from ..record.in_step_restarts import split_by_start, swap_words
from ..record.result import REPORT_ARTIFACT, TorchrunResult, none_suspected, suspected
from ..record import evidence, goodput, what_ran
from . import preflight as card_preflight, progress as card_progress, starts, timeline
from .text import CARD_LINE_CHARS, clip, clip_lines, escape_markdown, html_line, sentence, text_block, with_wrap_style

# The card's caps: rows of the Ranks table, ranks whose last lines are shown and the characters of
# one stream's, of one rank's stack and of the root cause.
CARD_RANK_ROWS = 256
CARD_TAIL_RANKS = 16
CARD_TAIL_CHARS = 8000
CARD_STACK_CHARS = 6000
CARD_CAUSE_CHARS = 16000
# Where a rank's whole output is (the gang carries at most 1,000 characters of a line).
WHOLE_OUTPUT = "each rank's log files, `rank-N.stdout.log` and `rank-N.stderr.log` in `result.log_dir` on its node"
_CUT_LINE = re.compile(r"… \[\d+ (more )?characters( in all)?\]$", re.M)
# Places (ranks grouped by where they were) and full stacks shown: 8,192 stacks of up to 16 KiB
# would make a card of 128 MB; the full report holds the rest.
CARD_PLACES = 50
CARD_RANK_STACKS = 64


def _fmt_time(t: Optional[float], origin: float) -> str:
    return "" if t is None else "+%.1f s" % (t - origin)


def _secs(value: Optional[float]) -> str:
    return "%.1f s" % value if value is not None else ""


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


def title_markdown(flow: str, pathspec: str, attempt: int) -> str:
    """The card's heading: each attempt of a task has a card of its own."""
    name = flow if flow.isidentifier() else escape_markdown(flow)
    return "# @torchrun: %s, attempt %d\n\n`%s` (attempt %d)" % (name, attempt, pathspec, attempt)


def summary_markdown(result: TorchrunResult, flow: str, pathspec: str, attempt: int = 0) -> str:
    if result.succeeded:
        status = "**Succeeded** in %.1f s" % result.duration
        again = restarted_words(result)
        if again:  # the failures it came back from, first: an HTML block, the causes' text as it is
            status = "<p><strong>Succeeded</strong> in %.1f s, %s</p>" % (result.duration, again)
    else:
        summary = result.cause.summary if result.cause is not None else None
        # An HTML block, one line: the cause's text exactly as it is.
        status = "<p><strong>Failed</strong>: %s</p>" % html_line(summary or _fmt_code(result.exit_code))
        suspects = suspected(result.culprits, result.cause)
        if suspects:  # the console's first line of it, as it says it, and the first suspect it names
            head = " ".join([suspects[0].split(": ", 1)[-1]] + [line.strip() for line in suspects[1:2]])
            status += "<p><strong>Suspected cause</strong>: %s</p>" % html_line(head, CARD_LINE_CHARS)
        refused = not_restarted(result.cause, result.restarts_allowed, result.restarts)
        if refused:
            status += "<p>%s</p>" % html_line(refused[:1].upper() + refused[1:], CARD_LINE_CHARS)
    return "%s\n\n%s" % (title_markdown(flow, pathspec, attempt), status)


def topology_rows(result: TorchrunResult, backend: str) -> List[List[str]]:
    return [
        ["nodes x processes", "%d x %s" % (result.num_nodes, result.nproc_per_node)],
        ["control address", str(result.main_addr)],
        ["this node's address", str(result.local_addr)],
        ["rendezvous port (%s)" % rendezvous_backend(result.command), str(result.rdzv_port)],
        ["gang service port", str(result.gang_port)],
        ["backend", backend],
        ["restarts", restarts_words(result)],
        ["this node", str(result.node_index)],
    ] + bench_rows(result)


def bench_rows(result: TorchrunResult) -> List[List[str]]:
    """With ``@torchrun(spares)``: this node's part at the call's end and the nodes that sat it out."""
    if result.role == "active" and not result.spare_nodes and not result.out_nodes:
        return []
    def listed(nodes: List[int]) -> str:
        return ", ".join(map(str, nodes)) or "none"
    return [["this node's role", result.role], ["spares left", listed(result.spare_nodes)],
            ["taken out", listed(result.out_nodes)]]


def rendezvous_backend(command: List[str]) -> str:
    """The rendezvous the call's torchrun used, as its command says."""
    for i, arg in enumerate(command or []):
        if arg.startswith("--rdzv-backend="):
            return arg.split("=", 1)[1]
        if arg == "--rdzv-backend" and i + 1 < len(command):
            return command[i + 1]
    return "unknown"


def timeline_parts(result: TorchrunResult, Markdown: Any) -> list:
    """The chart, or a line saying why there is none."""
    try:
        from metaflow.cards import VegaChart
    except ImportError:  # Metaflow before VegaChart
        return [Markdown("## Timeline"), Markdown("_This Metaflow's cards have no chart component._")]
    gang = timeline.from_result(result, gang_ranks(result))
    parts = [Markdown("## Timeline"), VegaChart(timeline.spec(gang))]
    notes = timeline.captions(gang)
    if notes:
        parts.append(Markdown("_%s; the Ranks table below has every rank._" % sentence(notes)))
    return parts


def shown_ranks(ranks: List[Tuple[int, RankStatus]], limit: int) -> List[Tuple[int, RankStatus]]:
    """At most ``limit`` of (node, rank record), in rank order: the failed ranks, then the lowest."""
    if len(ranks) <= limit:
        return ranks
    failed = [i for i, (_, r) in enumerate(ranks)
              if timeline.rank_state(r, None) == "rank: failed"][:limit]
    rest = [i for i in range(len(ranks)) if i not in set(failed)][: limit - len(failed)]
    return [ranks[i] for i in sorted(failed + rest)]


RANK_HEADERS = ["rank", "node", "local rank", "pid", "exit", "duration"]


def rank_headers(result: TorchrunResult) -> List[str]:
    """With restarts, a column says which start each row is."""
    runs = starts.rank_runs(result, gang_ranks(result))
    return RANK_HEADERS[:2] + ["start"] + RANK_HEADERS[2:] if starts.restarted(runs) else RANK_HEADERS


def rank_rows(result: TorchrunResult, limit: int = CARD_RANK_ROWS) -> List[List[str]]:
    """A row per rank, and with restarts per start of it (the failed start's failed rank first when cut)."""
    runs = starts.rank_runs(result, gang_ranks(result))
    if not starts.restarted(runs):
        every = [(node, r) for node, ranks in gang_ranks(result).items() for r in ranks]
        every.sort(key=lambda nr: (nr[1].rank, nr[0]))
        rows = [[str(r.rank), str(node), str(r.local_rank), str(r.pid), _fmt_code(r.exit_code), _took(r)]
                for node, r in shown_ranks(every, limit)]
        total = len(every)
    else:
        last = starts.last_start(result)
        runs.sort(key=lambda run: (run.rank, run.start, run.node))
        failed = [i for i, run in enumerate(runs) if run.state == "rank: failed"][:limit]
        kept = sorted(failed + [i for i in range(len(runs)) if i not in set(failed)][: limit - len(failed)])
        rows = [[str(run.rank), str(run.node), starts.start_words(run.start, last), str(run.record.local_rank),
                 str(run.record.pid), starts.exit_words(run, last), _took(run.record, run.end)]
                for run in (runs[i] for i in kept)]
        total = len(runs)
    if total > len(rows):
        rows.append(["%d more ranks" % (total - len(rows))] + [""] * (len(rows[0]) - 1 if rows else 5))
    return rows


def _took(r: Any, end: Optional[float] = None) -> str:
    stop = r.end if r.end else end
    return "%.1f s" % (stop - r.start) if r.start and stop else ""


def restarts_words(result: TorchrunResult) -> str:
    """The Topology row: restarts used of those allowed, which a bare count of the used ones hid."""
    allowed, used = result.restarts_allowed, result.restarts
    if not allowed and not used:
        return "none allowed (@torchrun(restarts=0))"
    return "%d used of %d allowed" % (used, max(allowed, used))


def restarted_words(result: TorchrunResult) -> str:
    """``after 1 in-step restart: restart 1, rank 3 (node 1) ...: killed by signal SIGKILL`` (HTML-escaped),
    else ""."""
    restarts = result.in_step_restarts
    if not restarts:
        return ""
    latest = restarts[-1]
    what = ("swap" if latest.swapped_in is not None else "restart") + " %d" % latest.restart
    return "after %s (%s: %s)" % ("1 in-step restart" if len(restarts) == 1 else "%d in-step restarts, the latest"
                                  % len(restarts), what, html_line(restart_cause(result, latest), CARD_LINE_CHARS))


def stack_parts(result: TorchrunResult, Markdown: Any, Table: Any) -> list:
    """Where the ranks were when the job was stopped: the places (odd ones out first), then the
    first ranks' full stacks, each collapsed."""
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
    """Every attempt of the step, times from the first one's start, and what each failure cost."""
    rows: List[List[str]] = []
    attempts = result.attempts
    if len(attempts) < 2:
        return rows
    origin = attempts[0].started_at or 0.0
    for a in attempts:
        calls = ", ".join(_fmt_time(c.started_at, origin) for c in a.calls)
        resumed = a.resumed_from
        meta = (resumed.metadata if resumed is not None else None) or {}
        label = ("%s (%s)" % (resumed.created_on, ", ".join("%s=%s" % kv for kv in sorted(meta.items())))
                 if resumed is not None else "")
        rows.append([
            str(a.attempt), _fmt_time(a.started_at, origin), _secs(a.gang_formed_seconds),
            calls, clip(a.stopped or ""), clip(label),
            _secs(a.lost_work_seconds), _secs(a.restart_seconds), (a.card or "")[:CARD_HASH_SHOWN],
        ])
    return rows


def evidence_markdown(pathspec: str, result: TorchrunResult) -> str:
    """Where this attempt's evidence bundle is, and the previous attempt's, to compare."""
    attempt = result.attempts[-1].attempt if result.attempts else 0
    line = "Evidence (grouped stacks, every rank's last lines, NCCL Flight Recorder dumps, `nvidia-smi -q` of " \
           "the failing node where present): artifact `%s` of this task, `Task(%r, attempt=%d)['%s'].data`" % (
               evidence.ARTIFACT, pathspec, attempt, evidence.ARTIFACT)
    if attempt > 0:
        line += "; the previous attempt's: `attempt=%d`" % (attempt - 1)
    return line + "."


def goodput_parts(result: TorchrunResult, Markdown: Any, Table: Any) -> list:
    """The goodput ledger: effective training time, a bar per attempt, the seconds of each part."""
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
# Under the table: the Goodput table cuts the same time at the same marks.
ATTEMPT_COSTS = ("_Lost work_: training since the checkpoint the next attempt resumed from (since the first line "
                 "without one) up to the failure, as in the Goodput table. _Failure to next first line_: from the "
                 "failure to the next attempt's first line, which the Goodput table splits into this attempt's "
                 "_stop_ and _restart_ and the next attempt's _restart_. _Card_: that attempt's card, opened "
                 "with `card view <run>/<step>/<task> --hash <card>`.")


def restart_rows(result: TorchrunResult) -> List[List[str]]:
    """The call's in-step restarts, counted like attempts: times from the call's start, what each cost."""
    return [[str(r.restart), _fmt_time(r.failed_at, result.started_at), clip(restart_cause(result, r)),
             resumed_words(r), _secs(r.lost_work_seconds), _secs(r.restart_seconds)]
            for r in result.in_step_restarts[-CARD_RANK_ROWS:]]


def resumed_words(r: Any) -> str:
    """Where the restart's ranks resumed: a step in memory and the steps lost, or not from memory."""
    if getattr(r, "resumed_step", None) is None:
        return "not from memory (your checkpoint)"
    whose = "node %d's copy" % r.resumed_from if r.resumed_from is not None else "this node's copy"
    return "step %d from memory (%s), %s lost" % (r.resumed_step, whose, count(r.steps_lost or 0, "step"))


def restart_cause(result: TorchrunResult, r: Any) -> str:
    """A restart's cause; a swap's after the nodes it swapped, hosts from the attempt's record."""
    if r.swapped_out is None or r.swapped_in is None:
        return r.cause.summary
    marks = {(m.call, m.restart): m for m in (result.attempts[-1].restarts if result.attempts else ())}
    mark = marks.get((result.call, r.restart))
    swap = mark.swap if mark is not None and mark.swap else swap_words(r.swapped_out, r.swapped_in, {})
    return "%s: %s" % (swap, r.cause.summary)


RESTART_HEADERS = ["restart", "failed at", "cause", "resumed at", "work lost (at most)", "back to your script in"]


def node_tails(result: TorchrunResult) -> Dict[Tuple[int, int], Mapping[str, Sequence[str]]]:
    """(node, rank) -> its last lines: after a swap a rank's number ran on two nodes."""
    return dict(sorted(((node, rank), streams) for node, report in result.gang.reports.items()
                       for rank, streams in report.tails.items()))


def tail_parts(result: TorchrunResult, Markdown: Any) -> list:
    """The last lines of each rank's output: the root cause's rank, then failed ranks, then the lowest; after a
    restart, each run of lines says the start it came from."""
    tails = {key: streams for key, streams in node_tails(result).items()
             if any(streams.get(s) for s in ("stdout", "stderr"))}
    if not tails:
        return []
    failed = {(node, r.rank) for node, ranks in gang_ranks(result).items() for r in ranks
              if timeline.rank_state(r, None) == "rank: failed"}
    root = result.cause.rank if result.cause is not None else None
    order = sorted(tails, key=lambda k: (k[1] != root, k not in failed, k[1], k[0]))[:CARD_TAIL_RANKS]
    last, of_report = starts.last_start(result), starts.report_starts(result)
    parts = [Markdown("## Last lines of each rank")]
    if last:
        parts.append(Markdown(TAILS_BY_START))
    cut = False
    for node, rank in sorted(order, key=lambda k: (k[1] != root, k[1], k[0])):
        for stream in ("stdout", "stderr"):
            lines = list(tails[(node, rank)].get(stream) or [])
            runs = split_by_start(lines, of_report.get((node, rank), last)) if last else [(0, lines)]
            for start, run in runs:
                body, clipped = clip_lines("\n".join(run), CARD_TAIL_CHARS, keep="tail")
                cut = cut or clipped or bool(_CUT_LINE.search(body))
                head = "rank %d %s" % (rank, stream) if not last else "rank %d (node %d) %s, start %s" % (
                    rank, node, stream, starts.start_words(start, last))
                parts.append(Markdown("**%s**\n\n%s" % (head, text_block(body))))
    notes = []
    if len(tails) > len(order):
        notes.append("%d of %d ranks shown (the failing ones first)" % (len(order), len(tails)))
    if cut:
        notes.append("long lines are cut, saying how long they were")
    if notes:
        parts.append(Markdown("_%s; the whole of every rank's output: %s._" % (sentence(notes), WHOLE_OUTPUT)))
    return parts


TAILS_BY_START = ("_The ranks restarted: a rank's log files hold every start's lines, so each run of lines below "
                  "says which start wrote it._")


def refusal_reason(result: TorchrunResult) -> Optional[str]:
    """Why a call was refused before any rank started (a card without empty tables), or None."""
    cause = result.cause
    ran = bool(result.ranks) or result.exit_code is not None
    if cause is None or ran or not (is_refusal(cause) or cause.kind is CauseKind.PREFLIGHT):
        return None
    return cause.message or cause.summary


def what_ran_parts(result: TorchrunResult, Markdown: Any, Table: Any) -> list:
    # A table cell is drawn as text: clipped, never escaped (an entity would show as typed).
    rows = [[clip(k), clip(v, CARD_LINE_CHARS)] for k, v in what_ran.rows(result.ran, result.num_nodes)]
    return [Markdown("## What ran"), Table(rows, headers=["", ""])] if rows else []


def refused_components(result: TorchrunResult, flow: str, pathspec: str, reason: str, attempt: int = 0) -> list:
    refused = text_block(clip_lines(reason, CARD_CAUSE_CHARS)[0])
    parts = [Markdown(title_markdown(flow, pathspec, attempt)),
             Markdown("**Refused before any rank started:**\n\n%s" % refused)]
    parts += what_ran_parts(result, Markdown, Table)
    if attempt_rows(result):
        parts += [Markdown("## Attempts"), Table(attempt_rows(result), headers=ATTEMPT_HEADERS)]
    parts.append(Markdown(with_wrap_style("_Generated %s_" % time.strftime("%Y-%m-%d %H:%M:%S"))))
    return parts


def build_components(result: TorchrunResult, flow: str, pathspec: str, backend: str, attempt: int = 0) -> list:
    reason = refusal_reason(result)
    if reason is not None:
        return refused_components(result, flow, pathspec, reason, attempt)
    parts = [
        Markdown(summary_markdown(result, flow, pathspec, attempt)),
        *card_progress.parts(result.progress),
        *what_ran_parts(result, Markdown, Table),
        Markdown("## Topology"),
        Table(topology_rows(result, backend), headers=["", ""]),
    ]
    parts += timeline_parts(result, Markdown)
    parts += [
        Markdown("## Ranks"),
        Table(rank_rows(result), headers=rank_headers(result)),
    ]
    if attempt_rows(result):
        parts += [Markdown("## Attempts"), Table(attempt_rows(result), headers=ATTEMPT_HEADERS),
                  Markdown(ATTEMPT_COSTS)]
    if result.in_step_restarts:
        parts += [Markdown("## Restarts in the step"), Table(restart_rows(result), headers=RESTART_HEADERS)]
    parts += goodput_parts(result, Markdown, Table)
    cause = result.cause
    if cause is not None:
        # The suspects (procs/culprit.py) as the failure says them: by rank, node, host and place.
        said = suspected(result.culprits, cause) or none_suspected(result.culprits, result.flight_unread, cause)
        text, _ = clip_lines("\n\n".join([cause.summary] + ["\n".join(said)]).strip(), CARD_CAUSE_CHARS)
        parts.append(Markdown("## Root cause\n\n%s" % text_block(text)))
        parts.append(Markdown(evidence_markdown(pathspec, result)))
    parts.extend(stack_parts(result, Markdown, Table))
    parts.extend(card_preflight.parts(result.preflight))
    parts.extend(tail_parts(result, Markdown))
    parts.append(Markdown(with_wrap_style("_Generated %s_" % time.strftime("%Y-%m-%d %H:%M:%S"))))
    return parts


def backend_label(accelerators: Accelerators, cuda_count: Optional[int]) -> str:
    """The backend to expect: the script picks it, so say what the step asked for, not the machine."""
    n = accelerators.count
    if accelerators.kind == "gpu":
        asked = "the step asked for %d GPU%s" % (n, "" if n == 1 else "s")
        if cuda_count == 0:
            return "gloo expected (%s, but no CUDA device is visible)" % asked
        return "nccl expected (%s)" % asked
    if accelerators.kind == "neuron":
        return "chosen by the script (the step asked for %d Neuron device%s)" % (n, "" if n == 1 else "s")
    return "gloo expected (the step asked for no GPU)"
