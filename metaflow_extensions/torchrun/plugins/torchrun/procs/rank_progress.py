"""A rank's progress: its step, the total if known, a few numeric metrics, and
which start of the ranks it belongs to (a restart's ranks report afresh).

``report`` runs every step, so it only keeps the latest in memory; a daemon
thread writes it at most once every ``REPORT_INTERVAL``. Users import it as
``from metaflow_extensions.torchrun.progress import report``. The whole path of
a report, rank to card: gang/gang_progress.py.
"""

from __future__ import annotations

import atexit
import math
import operator
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, Mapping, Optional, Tuple

from ..base.codec import SKIP, Written
from ..base.timeouts import REPORT_INTERVAL
from .names import PROGRESS_SUFFIX, RESTART_COUNT_ENV, WORK_DIR_ENV, rank_file
from .records import read_rank_files, stamp, write_json

# A node's heartbeat stays small whatever a script passes.
MAX_METRICS = 8
MAX_METRIC_NAME = 40
STEP_LIMIT = 1 << 53  # an exact float in JSON


@dataclass(frozen=True)
class ProgressReport(Written):
    """``time``: the rank's wall clock; the node compares its own ranks' only. ``start``: the start of
    the ranks (torchelastic's restart count, the gang's restart): a file the replaced ranks left is not
    taken for the new ranks' progress."""

    rank: int
    step: int
    total: Optional[int] = None
    metrics: Dict[str, float] = field(default_factory=dict)
    time: float = 0.0
    start: Annotated[int, SKIP] = 0
    # This rank's first report of its start, step and time: where a restart's ranks resumed (the step before).
    first_step: Annotated[Optional[int], SKIP] = None
    first_time: Annotated[Optional[float], SKIP] = None

    @property
    def first(self) -> Tuple[int, float]:
        """(step, time) of this rank's first report of its start; its latest where the file does not say."""
        if self.first_step is not None and self.first_time is not None:
            return self.first_step, self.first_time
        return self.step, self.time

    @classmethod
    def from_file(cls, data: Any) -> Optional["ProgressReport"]:
        if not isinstance(data, Mapping):
            return None
        rank, step, when = _count(data.get("rank")), _count(data.get("step")), stamp(data.get("time"))
        if rank is None or step is None or when is None:
            return None
        total = _count(data.get("total"))
        first_step, first_time = _count(data.get("first_step")), stamp(data.get("first_time"))
        known = first_step is not None and first_time is not None and first_step <= step
        return cls(rank=rank, step=step, total=total if total else None,
                   metrics=clean_metrics(data.get("metrics")), time=when, start=_count(data.get("start")) or 0,
                   first_step=first_step if known else None, first_time=first_time if known else None)


def clean_metrics(metrics: Any) -> Dict[str, float]:
    """Anything past the bounds is left out: a metric is never worth an error."""
    kept: Dict[str, float] = {}
    if not isinstance(metrics, Mapping):
        return kept
    for name, value in metrics.items():
        if len(kept) >= MAX_METRICS:
            break
        if not isinstance(name, str) or not 0 < len(name) <= MAX_METRIC_NAME:
            continue
        try:
            number = float(value)  # a Python or numpy number, a 0-d tensor
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number) and not isinstance(value, bool):
            kept[name] = number
    return kept


def _count(value: Any) -> Optional[int]:
    """From anything with ``__index__`` (int, numpy, a 0-d integer tensor)."""
    if isinstance(value, bool):
        return None
    try:
        number = operator.index(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if 0 <= number < STEP_LIMIT else None


# (step, total, metrics, time): replaced whole, so the writer never sees half of one.
_latest: Optional[Tuple[Any, Any, Dict[str, Any], float]] = None
_first: Optional[Tuple[Any, float]] = None  # this process's first report: (step, time)
_writer: Optional["_Writer"] = None
_start_lock = threading.Lock()


def report(step: int, total: Optional[int] = None, **metrics: float) -> None:
    """Report this rank's training step (``total``: the steps the run will
    take, for the percentage and the ETA) and a few numbers such as
    ``loss=0.31, lr=3e-4``: at most 8 are kept, in the order given. Cheap
    enough for every step: nothing is checked or written here; at most one
    report a second leaves the rank. Pass Python numbers (``loss.item()``):
    a tensor is kept, with its graph, until the next report replaces it."""
    global _latest, _first
    _latest = (step, total, metrics, time.time())
    if _first is None:
        _first = (step, _latest[3])
    if _writer is None:
        _start()


def _start() -> None:
    global _writer
    with _start_lock:
        if _writer is not None:
            return
        _writer = _Writer(os.environ.get(WORK_DIR_ENV, ""), os.environ.get("RANK", ""),
                          os.environ.get(RESTART_COUNT_ENV, ""))
        _writer.start()
        if _writer.path:  # the first report of a rank of ours: what it loaded by its first step is what a
            # restart's ranks need (once, about 20 ms, before its next step: a failure comes after it)
            from . import warm_imports  # off the import of progress: the first report alone

            warm_imports.offer()


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) has no writer thread: its reports go
    nowhere rather than race its parent's file."""
    global _writer, _latest, _first
    _writer = _Writer("", "", "")
    _latest = _first = None


os.register_at_fork(after_in_child=_forget_in_child)


class _Writer:
    def __init__(self, directory: str, rank: str, start: str) -> None:
        number = _digits(rank)
        self.path = rank_file(directory, number, PROGRESS_SUFFIX) if directory and number is not None else ""
        self.rank = number or 0
        self.of_start = _digits(start) or 0  # torchelastic's restart count, the gang's restart
        self.written: Any = None
        self.warned = False
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def start(self) -> None:
        if not self.path:
            return
        threading.Thread(target=self._loop, name="torchrun-progress", daemon=True).start()
        atexit.register(self._last)

    def _loop(self) -> None:
        while not self.stop.wait(REPORT_INTERVAL):
            self.write()

    def _last(self) -> None:
        self.stop.set()
        self.write()

    def write(self) -> None:
        latest = _latest
        with self.lock:
            if latest is None or latest is self.written:
                return
            self.written = latest
            record = self._record(latest)
            if record is None:
                return
            try:
                write_json(self.path, record.to_wire())
            except OSError:
                pass  # the work directory is gone: the call has ended

    def _record(self, latest: Tuple[Any, Any, Dict[str, Any], float]) -> Optional[ProgressReport]:
        step, total, metrics, when = latest
        number = _count(step)
        if number is None:
            if not self.warned:
                self.warned = True
                sys.stderr.write("metaflow-torchrun: progress.report(step=%.40r) ignored: the step must be a "
                                 "whole number >= 0\n" % (step,))
            return None
        whole = _count(total)
        first_step, first_time = (_count(_first[0]), _first[1]) if _first is not None else (None, None)
        return ProgressReport(rank=self.rank, step=number, total=whole if whole else None,
                              metrics=clean_metrics(metrics), time=when, start=self.of_start,
                              first_step=first_step, first_time=first_time if first_step is not None else None)


def _digits(text: str) -> Optional[int]:
    """An environment variable's whole number, or None."""
    return _count(int(text)) if text.isdigit() and text.isascii() else None


def read_progress(directory: str) -> Dict[int, ProgressReport]:
    found: Dict[int, ProgressReport] = {}
    for rank, data in read_rank_files(directory, PROGRESS_SUFFIX):
        one = ProgressReport.from_file(data)
        if one is not None and one.rank == rank:
            found[rank] = one
    return found

