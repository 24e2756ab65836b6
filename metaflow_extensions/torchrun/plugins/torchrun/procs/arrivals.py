"""When this rank reached each of its latest collectives, read from torch's Flight Recorder while it
trains, so the gang can tell which rank the others wait for (gang/arrivals.py).

In a lockstep job every rank leaves a collective together, so step rates cannot tell the ranks apart;
the moment each rank *enqueued* the collective can: the rank the others wait for is the last to arrive.
The recorder stamps each entry with that moment (``time_created_ns``, the host's wall clock), for gloo
and NCCL alike. A daemon thread dumps the recorder every ``EVERY`` seconds, keeps the default group's
newest collectives and writes them to the rank's ``rank-<R>.arrivals.json``; nothing is done where the
recorder is off or the group is not up yet. Only the newest entries of the dump are parsed (a full
``json.loads`` of 2,000 entries cost as much as torch's dump, and set off Python's garbage collector):
the dump itself is the cost, and ``EVERY`` keeps it near 1 % of the rank's time (docs/benchmarks.md,
"Who the gang waits for")."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from .flight_ask import default_backends, dump_recorder, recorder_for
from .names import ARRIVALS_SUFFIX, RESTART_COUNT_ENV, rank_file
from .records import read_json, write_json

EVERY = 5.0  # seconds between two reads of the recorder: a full one's dump takes torch 30 to 40 ms (2,000 entries)
KEPT = 128  # collectives a rank's file holds, the newest
DEFAULT_GROUP = "default_pg"


_ENTRY = '{"collective_seq_id"'  # how torch writes an entry: its keys in order, this one first
_DECODER = json.JSONDecoder()


def tail_entries(text: Any, count: int) -> List[Any]:
    """The newest ``count`` entries of a dump, each parsed alone (the dump lists them in the order they were
    recorded); the whole dump parsed where it is not written so."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return []
    at = len(text)
    for _ in range(count):
        found = text.rfind(_ENTRY, 0, at)
        if found < 0:
            break
        at = found
    if at == len(text):
        return _all_entries(text)
    out: List[Any] = []
    try:
        while at < len(text) and text[at] == "{":
            entry, at = _DECODER.raw_decode(text, at)
            out.append(entry)
            while at < len(text) and text[at] in " ,\n":
                at += 1
    except ValueError:
        return _all_entries(text)
    return out


def _all_entries(text: str) -> List[Any]:
    try:
        found = json.loads(text).get("entries")
    except (ValueError, AttributeError):
        return []
    return found if isinstance(found, list) else []


def arrivals_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, ARRIVALS_SUFFIX)


def newest(entries: Any, after: int, kept: int = KEPT) -> List[Tuple[int, int]]:
    """(sequence number, enqueued at in ns) of the default group's collectives after ``after``, the newest
    ``kept``; an entry not as torch writes it is skipped."""
    found: Dict[int, int] = {}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        group = entry.get("process_group")
        seq, at = entry.get("collective_seq_id"), entry.get("time_created_ns")
        if not (isinstance(group, list) and len(group) == 2 and group[1] == DEFAULT_GROUP):
            continue
        if type(seq) is int and type(at) is int and seq > after and at > 0:
            found[seq] = at
    return sorted(found.items())[-kept:]


class ArrivalWatch:
    """The rank's reader: its thread, and the collectives written so far."""

    def __init__(self, directory: str, rank: int, every: float = EVERY) -> None:
        self.path = arrivals_path(directory, rank)
        self.rank = rank
        self.every = every
        self.kept: List[Tuple[int, int]] = []
        self.stop = threading.Event()
        text = os.environ.get(RESTART_COUNT_ENV, "0")
        self.of_start = int(text) if text.isdigit() else 0  # the start of the ranks this one belongs to

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="torchrun-arrivals", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.read_once(sys.modules.get("torch.distributed"), sys.modules.get("torch._C._distributed_c10d"))
            except Exception:
                return  # best effort: a recorder that cannot be read is not read again

    def read_once(self, dist: Any, c10d: Any) -> bool:
        """Whether new collectives were written."""
        if dist is None or c10d is None or not dist.is_available() or not dist.is_initialized():
            return False
        if dist.get_world_size() < 2:
            self.stop.set()  # nobody waits for anybody
            return False
        text, _ = dump_recorder(c10d, recorder_for(default_backends(dist)))
        if text is None:
            self.stop.set()
            return False
        every = newest(tail_entries(text, KEPT), 0)
        if self.kept and every and every[-1][0] < self.kept[-1][0]:
            self.kept = []  # a new group (torch's own restart): its numbers begin again
        after = self.kept[-1][0] if self.kept else 0
        new = [(seq, at) for seq, at in every if seq > after]
        if not new:
            return False
        self.kept = (self.kept + new)[-KEPT:]
        write_json(self.path, {"rank": self.rank, "start": self.of_start, "seq": [s for s, _ in self.kept],
                               "ns": [t for _, t in self.kept]})
        return True


def read_arrivals(directory: str, rank: int, start: int) -> Optional[Dict[int, int]]:
    """A rank's file as written by start ``start`` of the ranks: sequence number -> enqueued at (ns)."""
    data = read_json(arrivals_path(directory, rank))
    if not isinstance(data, dict) or data.get("start") != start:
        return None
    seq, ns = data.get("seq"), data.get("ns")
    if not (isinstance(seq, list) and isinstance(ns, list) and len(seq) == len(ns) <= KEPT):
        return None
    if not all(type(v) is int and v >= 0 for v in seq + ns):
        return None
    return dict(zip(seq, ns))


def watch(directory: Optional[str], rank: int) -> Optional[ArrivalWatch]:
    if not directory or rank < 0 or not os.path.isdir(directory):
        return None
    one = ArrivalWatch(directory, rank)
    one.start()
    return one
