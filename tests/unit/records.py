"""Typed records from the shapes a stored ``torchrun-result`` holds: tests write
a result's cause, gang view and attempts as the record has them on the wire,
and the result holds them typed (``TorchrunResult`` is typed to the edge)."""

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause
from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import NodeReport, RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import Attempt
from metaflow_extensions.torchrun.plugins.torchrun.record.gang_view import GangView


def cause(data):
    """A cause as the record keeps it; its kind "failed" unless given."""
    return Cause.from_wire(dict({"kind": "failed"}, **data))


def gang(data):
    """{"joined_at": {"0": t}, "finished_at": ..., "reports": {"0": {"ranks": [...], "tails": ...}}},
    built as given, unchecked: a test may hand the card what no peer could send."""
    reports = {}
    for node, report in (data.get("reports") or {}).items():
        known = RankStatus.__dataclass_fields__  # a field no record has is not carried
        ranks = tuple(RankStatus(**{k: v for k, v in dict({"local_rank": r.get("rank", 0)}, **r).items() if k in known})
                      for r in report.get("ranks") or [])
        tails = {int(rank): {s: tuple(lines) for s, lines in streams.items()}
                 for rank, streams in (report.get("tails") or {}).items()}
        reports[int(node)] = NodeReport(ranks=ranks, tails=tails, started=report.get("started"),
                                        ended=report.get("ended"), truncated=report.get("truncated") is True)
    return GangView({int(k): v for k, v in (data.get("joined_at") or {}).items()},
                    {int(k): v for k, v in (data.get("finished_at") or {}).items()}, reports)


def attempts(items):
    return [Attempt.from_wire(a) for a in items]
