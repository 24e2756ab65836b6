"""``python flow.py torchrun history`` (the node history, over the metadata and datastore the flow's
options name) and ``python flow.py torchrun ps`` (the ranks of the flow's running steps on this host),
as commands of the flow's own CLI (Metaflow's ``CLIS_DESC``).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from metaflow._vendor import click

from .base.text import count, shorten

if TYPE_CHECKING:
    from .procs.running import RunningRank

MAX_ROWS = 50
MAX_CAUSES = 10
BLAMED_FOR = 120  # a host's row: its causes in this many characters
MIN_CAUSE = 20  # a second cause with less room than this is left to --json


@click.group()
def cli() -> None:
    pass


@cli.group(help="Commands of @torchrun.")
@click.pass_context
def torchrun(ctx: Any) -> None:
    # The client reads what the flow's options name (as `card` does), not the profile's defaults.
    from metaflow import metadata

    metadata("@".join([ctx.obj.metadata.TYPE, ctx.obj.metadata.default_info()]))


@torchrun.command(help="Which hosts failed or were slow, how often, and which causes recurred, "
                       "over this flow's last runs (or every flow's in the namespace).")
@click.option("--last", "last", type=int, default=None, help="The last N runs of each flow (default 20).")
@click.option("--days", type=float, default=None, help="The runs of the last D days.")
@click.option("--all-flows", is_flag=True, default=False, help="Every flow in the current namespace.")
@click.option("--json", "as_json", is_flag=True, default=False, help="JSON instead of a table.")
@click.pass_obj
def history(obj: Any, last: Optional[int], days: Optional[float], all_flows: bool, as_json: bool) -> None:
    if last is None and days is None:
        last = 20
    if (last is not None and last < 1) or (days is not None and days <= 0):
        raise click.BadParameter("--last and --days take a positive number")
    from .record import node_history  # a command's body: `import metaflow` loads this group, not its records

    seen = node_history.read(None if all_flows else obj.flow.name, last=last, days=days)
    report = node_history.report(seen)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    for line in table(report):
        click.echo(line)


@torchrun.command(help="The ranks of this flow's running @torchrun steps on this host (every node of a local "
                       "run): run, step, node, rank, pid and the command ps shows.")
@click.option("--all-flows", is_flag=True, default=False, help="Every flow's, not only this one's.")
@click.option("--json", "as_json", is_flag=True, default=False, help="JSON instead of a table.")
@click.pass_obj
def ps(obj: Any, all_flows: bool, as_json: bool) -> None:
    main = sys.modules.get("__main__")
    flow_file = None if all_flows else os.path.abspath(getattr(main, "__file__", None) or sys.argv[0])
    from .procs.running import running_ranks  # a command's body: `import metaflow` loads this group only

    ranks = running_ranks(flow_file)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in ranks], indent=2))
    elif not ranks:
        click.echo("no rank of %s is running on this host" % ("a @torchrun step" if all_flows else obj.flow.name))
    else:
        for line in ps_table(ranks):
            click.echo(line)


def ps_table(ranks: Sequence[RunningRank]) -> List[str]:
    head = ("run", "step", "node", "rank", "pid", "command")
    rows = [(r.run_id, r.step, str(r.node), str(r.rank), str(r.pid), r.command) for r in ranks]
    widths = [max([len(head[i])] + [len(r[i]) for r in rows]) for i in range(len(head) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in [head] + rows]


def table(report: Any) -> List[str]:
    """Hosts, then the causes that recurred, then those seen once."""
    hosts = report["hosts"]
    lines = ["%s, %s, %s" % (count(report["runs"], "run"), count(report["attempts"], "attempt"),
                             count(len(hosts), "host")), ""]
    head = ("host", "seen", "blamed", "slow", "last seen", "blamed for")
    rows = [(h["host"], str(h["appearances"]), str(h["blamed"]), str(h["slow"]), _when(h["last_seen"]),
             blamed_for(sorted(h["causes"].items(), key=lambda kv: -kv[1])))
            for h in hosts[:MAX_ROWS]]
    widths = [min(40, max([len(head[i])] + [len(r[i]) for r in rows])) for i in range(len(head) - 1)]
    for row in [head] + rows:
        lines.append("  ".join(shorten(c, 40).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    if len(hosts) > MAX_ROWS:
        lines.append("... %d more hosts (--json lists them all)" % (len(hosts) - MAX_ROWS))
    recurred = [c for c in report["causes"] if c["times"] > 1]
    once = [c for c in report["causes"] if c["times"] == 1]
    for title, causes in (("causes that recurred (blamed attempts):", recurred),
                          ("causes seen once (blamed attempts):", once)):
        if causes:
            lines += ["", title] + [_cause_line(c) for c in causes[:MAX_CAUSES]]
            if len(causes) > MAX_CAUSES:
                lines.append("  ... %d more (--json lists them all)" % (len(causes) - MAX_CAUSES))
    return lines


def blamed_for(causes: Sequence[Tuple[str, int]], width: int = BLAMED_FOR, shown: int = 2) -> str:
    """A host's causes, most frequent first, in ``width`` characters: each cut at most once, where a word
    ends, its count kept whole (cutting the joined text cut a cut cause again, and its count)."""
    parts: List[str] = []
    left = width
    for cause, times in causes[:shown]:
        tail = " (%dx)" % times
        room = left - len(tail) - (2 if parts else 0)
        if room < MIN_CAUSE:
            break
        parts.append(shorten(cause, room) + tail)
        left -= len(parts[-1]) + (2 if len(parts) > 1 else 0)
    return "; ".join(parts)


def _cause_line(cause: Any) -> str:
    hosts = cause["hosts"]
    return "  %dx  %s  (%s: %s%s)" % (cause["times"], shorten(cause["cause"], 100),
                                      "host" if len(hosts) == 1 else "hosts", ", ".join(hosts[:5]),
                                      ", ..." if len(hosts) > 5 else "")


def _when(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "?"
