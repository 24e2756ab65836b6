"""What torch's Flight Recorder says of one rank, in a few typed lines.

Why: the Flight Recorder logs every collective a process group issues (its
sequence number, its op, whether it completed) in C++, whatever issued it: a
call with ``async_op=True`` waited on later, DDP's gradient hooks, NCCL's
asynchronous work. The Python stacks miss all of those. Its dump is large (about
half a kilobyte per entry, 2,000 entries) and says far more than a hang needs,
so the rank boils it down here to a record of a few hundred bytes: per process
group, the last collective it entered and whether that completed. That record
crosses the gang (gang/messages.py ``Stacks``); culprit.py compares the ranks'.

The dump's keys are torch's writer's (``FlightRecorder::dump_json`` in
FlightRecorderDetail.hpp, format "2.10" in torch 2.13, 2.14.1 and 2.15.0, for
every backend): ``version``, ``entries`` (each with ``collective_seq_id``,
``op_id``, ``pg_id``, ``process_group`` as [name, description],
``profiling_name`` as "<backend>:<op>", ``is_p2p``, ``state`` one of
scheduled/started/completed, ``retired``) and ``pg_status`` (per ``pg_id``:
``last_enqueued_collective`` and ``last_completed_collective`` as strings).
Which of them says that a collective completed depends on the backend that
recorded it (``_done``). A format of another major version is not guessed at:
it reads as ``UNSUPPORTED``. Pure: no torch, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Dict, List, Mapping, Optional, Tuple

from ..base.codec import SKIP, Int, Items, OneOf, Record, Text

# A rank reports at most this many process groups: those with a collective
# still open first, then the busiest.
MAX_GROUPS = 4
NAME_CHARS = 64
OP_CHARS = 32
RECORDER_CHARS = 16
NOTE_CHARS = 160
MAX_SEQ = 1 << 62
# What a rank's answer says of its recorder.
OK = "ok"  # groups as recorded
EMPTY = "empty"  # torch.distributed is up but the recorder holds nothing (off)
NO_GROUP = "no_group"  # torch.distributed not imported, or no process group yet
UNSUPPORTED = "unsupported"  # this torch has no Flight Recorder dump
FAILED = "failed"  # the dump raised or did not parse
STATES = (OK, EMPTY, NO_GROUP, UNSUPPORTED, FAILED)
# The dump formats read here: major version 2 ("2.10" from torch 2.13 to 2.15).
FORMAT_MAJOR = "2"
# Which recorder a rank read (its default group's backend, as torch names the
# implementation): gloo's entries never change state once recorded, so their
# completion is in ``pg_status`` (counted in op_id); stock ProcessGroupNCCL's
# watchdog marks an entry "completed" (a retired entry that is not has timed
# out, and its ``pg_status`` mixes collective and point-to-point counts); a
# backend recorded by torch 2.15's per-backend hook (nccl2) is retired when
# it completes, or at issue where the backend cannot tell (then "scheduled").
GLOO = "gloo"
NCCL = "nccl"


class FlightError(ValueError):
    """A summary from another process that is not one."""


Seq = Annotated[int, Int(0, MAX_SEQ)]


@dataclass(frozen=True)
class FlightGroup(Record):
    """One process group as one rank saw it. ``entered``: the sequence number
    (among the group's collectives, the same on every rank that issued the
    same ones) of the last collective this rank entered; ``op`` its name;
    ``done`` whether it completed here."""

    ERROR = FlightError
    name: Annotated[str, Text(NAME_CHARS)]  # torch's name of the group: "0" is the default group
    entered: Seq
    op: Annotated[str, Text(OP_CHARS)]
    done: bool
    desc: Annotated[str, Text(NAME_CHARS)] = ""  # torch's description ("default_pg"), when it has one

    @property
    def waiting(self) -> bool:
        return not self.done


@dataclass(frozen=True)
class FlightSummary(Record):
    """One rank's answer: the state of its recorder and, when ``OK``, its groups.
    ``recorder``: the backend whose recorder was read; ``note``: why a state
    other than ``OK`` (a function this torch lacks, a format it writes that is
    not read here)."""

    ERROR = FlightError
    WIRE_ORDER = ("state", "entries", "groups", "recorder", "note")
    state: Annotated[str, OneOf(STATES)]
    groups: Annotated[Tuple[FlightGroup, ...], Items(MAX_GROUPS)] = ()
    entries: Seq = 0  # how many the recorder held (at most its size)
    recorder: Annotated[str, Text(RECORDER_CHARS), SKIP] = ""
    note: Annotated[str, Text(NOTE_CHARS), SKIP] = ""

    def group(self, name: str) -> Optional[FlightGroup]:
        return next((g for g in self.groups if g.name == name), None)


def summarize(dump: Any, recorder: str = GLOO) -> FlightSummary:
    """The summary of one dump (bytes or text of torch's JSON) from the
    ``recorder`` of that backend. Whatever does not read as torch's format
    reads as ``FAILED``, never as an exception: the dump's format is torch's,
    and it may change."""
    recorder = recorder[:RECORDER_CHARS]
    try:
        data = json.loads(dump)
        version = data["version"]  # none: not torch's dump (FAILED)
        if not isinstance(version, str) or version.split(".")[0] != FORMAT_MAJOR:
            return FlightSummary(UNSUPPORTED, recorder=recorder, note=(
                "its Flight Recorder writes format %s; this reads %s.x" % (version, FORMAT_MAJOR))[:NOTE_CHARS])
        entries = data.get("entries", [])
        status = data.get("pg_status", {})
        if not isinstance(entries, list) or not isinstance(status, dict):
            return FlightSummary(FAILED, recorder=recorder)
        if not entries:
            return FlightSummary(EMPTY, recorder=recorder)
        groups = _groups(entries, status, recorder)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError):
        return FlightSummary(FAILED, recorder=recorder)
    return FlightSummary(OK, tuple(groups), len(entries), recorder)


def _groups(entries: List[Any], status: Mapping[str, Any], recorder: str) -> List[FlightGroup]:
    """The last collective (not a send or receive) of each group in the ring,
    and whether it completed (``_done``)."""
    last: Dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, Mapping) and not entry.get("is_p2p"):
            last[str(entry["process_group"][0])] = entry  # in the order recorded: the last wins
    out = []
    for name, entry in last.items():
        done = _done(entry, status.get(str(entry.get("pg_id")), {}), recorder)
        op = str(entry.get("profiling_name", "")).split(":")[-1]  # "gloo:all_reduce" -> "all_reduce"
        desc = entry["process_group"][1] if len(entry["process_group"]) > 1 else ""
        out.append(FlightGroup(name[:NAME_CHARS], max(0, min(int(entry["collective_seq_id"]), MAX_SEQ)),
                               op[:OP_CHARS], done, str(desc)[:NAME_CHARS]))
    out.sort(key=lambda g: (g.done, -g.entered, g.name))  # open first, then the busiest
    return out[:MAX_GROUPS]


def _done(entry: Mapping[str, Any], pg: Any, recorder: str) -> bool:
    """Whether one entry's collective completed, as its backend's recorder
    tells it (GLOO and NCCL above)."""
    if entry.get("state") not in ("scheduled", "started", "completed"):
        raise ValueError("not one of torch's entry states")
    if recorder == NCCL:
        return entry["state"] == "completed"
    if recorder != GLOO:
        return entry["state"] == "completed" or bool(entry.get("retired"))
    completed = pg.get("last_completed_collective") if isinstance(pg, Mapping) else None
    if completed is not None:
        return int(entry["op_id"]) <= int(completed)
    return bool(entry.get("retired"))


def bound(summaries: Mapping[int, FlightSummary], budget: int) -> Dict[int, FlightSummary]:
    """At most about ``budget`` bytes of wire for one node's ranks: each rank
    keeps its first group only when all of theirs would not fit (the one with
    a collective open, if any), then ranks past what fits are left out."""
    out = dict(summaries)
    if _size(out) <= budget:
        return out
    out = {r: FlightSummary(s.state, s.groups[:1], s.entries) for r, s in out.items()}
    each = max(1, _size(out) // max(1, len(out)))
    return dict(sorted(out.items())[:max(0, budget // each)])


def _size(summaries: Mapping[int, FlightSummary]) -> int:
    return len(json.dumps({str(r): s.to_wire() for r, s in summaries.items()}))
