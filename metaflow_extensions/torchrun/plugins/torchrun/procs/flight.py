"""What torch's Flight Recorder says of one rank, in a few typed lines.

It sees async collectives and DDP's hooks, which no Python stack shows; its dump
(about 1 MB) is boiled down to a few hundred bytes that cross the gang. Keys as
torch's ``FlightRecorder::dump_json`` writes them (format "2.10", torch 2.13 to
2.15). Pure: no torch, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Dict, List, Mapping, Optional, Tuple

from ..base.codec import SKIP, Int, Items, OneOf, Record, Text

MAX_GROUPS = 4  # those with a collective open first, then the busiest
NAME_CHARS = 64
OP_CHARS = 32
RECORDER_CHARS = 16
NOTE_CHARS = 160
MAX_SEQ = 1 << 62
OK = "ok"  # groups as recorded
EMPTY = "empty"  # torch.distributed is up but the recorder holds nothing (off)
NO_GROUP = "no_group"  # torch.distributed not imported, or no process group yet
UNSUPPORTED = "unsupported"  # this torch has no Flight Recorder dump
FAILED = "failed"  # the dump raised or did not parse
STATES = (OK, EMPTY, NO_GROUP, UNSUPPORTED, FAILED)
FORMAT_MAJOR = "2"
# The recorder a rank read: its default group's backend, as torch names it (``_done``).
GLOO = "gloo"
NCCL = "nccl"


class FlightError(ValueError):
    """A summary from another process that is not one."""


Seq = Annotated[int, Int(0, MAX_SEQ)]


@dataclass(frozen=True)
class FlightGroup(Record):
    """``entered``: the sequence number of the last collective this rank
    entered (the same on every rank that issued the same ones)."""

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
    """``recorder``: the backend whose recorder was read; ``note``: why a state other than ``OK``."""

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
    """Whatever does not read as torch's format is ``FAILED``, never an
    exception: the format is torch's, and it may change."""
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
    """Stock NCCL's watchdog marks an entry "completed"; another backend's (2.15's
    nccl2) is retired when it completes. gloo's entries never change state: its
    worker retires an entry once the work is done, and ``pg_status`` (op_id) keeps
    the last one a worker finished. Either says done: with two workers, the one
    finishing an earlier op can write ``pg_status`` after the later op's, and
    then it reads one behind for good, while every entry's retirement is its own."""
    if entry.get("state") not in ("scheduled", "started", "completed"):
        raise ValueError("not one of torch's entry states")
    if recorder == NCCL:
        return entry["state"] == "completed"
    if recorder != GLOO:
        return entry["state"] == "completed" or bool(entry.get("retired"))
    completed = pg.get("last_completed_collective") if isinstance(pg, Mapping) else None
    return bool(entry.get("retired")) or (completed is not None and int(entry["op_id"]) <= int(completed))


def bound(summaries: Mapping[int, FlightSummary], budget: int) -> Dict[int, FlightSummary]:
    """About ``budget`` bytes: first each rank's first group only, then fewer ranks."""
    out = dict(summaries)
    if _size(out) <= budget:
        return out
    out = {r: FlightSummary(s.state, s.groups[:1], s.entries) for r, s in out.items()}
    each = max(1, _size(out) // max(1, len(out)))
    return dict(sorted(out.items())[:max(0, budget // each)])


def _size(summaries: Mapping[int, FlightSummary]) -> int:
    return len(json.dumps({str(r): s.to_wire() for r, s in summaries.items()}))
