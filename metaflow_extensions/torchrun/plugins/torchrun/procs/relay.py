"""A rank's output, labelled with its global rank, one whole line per write: ranks
sharing their agent's stdout would interleave mid-line. A forked process, so it
drains the pipes after the rank dies (a segfault's last words included).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Dict, Optional, Tuple

from ..host.private import open_private
from .names import rank_log_path
from .redraw import Redraw

ATOMIC_WRITE = 4096  # PIPE_BUF: a write this size never mixes with another writer's
MAX_LINE = 1 << 20  # a "line" longer is cut: memory stays bounded
READ_SIZE = 65536
# After a read short of the buffer: a rank logging line by line costs a few large
# reads, not a wake-up per line. A burst's first line is never held back.
SETTLE_SECONDS = 0.002
# A rank's own failure report (bootstrap.py) goes to its log only, between these lines.
LOG_ONLY_BEGIN = b"\x00mftr-log-only-begin\x00\n"
LOG_ONLY_END = b"\x00mftr-log-only-end\x00\n"


def settle_after(nbytes: int) -> None:
    if 0 < nbytes < READ_SIZE:
        time.sleep(SETTLE_SECONDS)


def whole_line_batches(data: bytes, limit: int = ATOMIC_WRITE):
    """Whole lines in writes of at most ``limit`` bytes (a longer line is its own)."""
    start = 0
    size = len(data)
    while start < size:
        end = start + limit
        if end >= size:
            yield data[start:]
            return
        cut = data.rfind(b"\n", start, end)
        if cut < start:
            cut = data.find(b"\n", end)
            if cut < 0:
                yield data[start:]
                return
        yield data[start : cut + 1]
        start = cut + 1


def write_all(fd: int, data: bytes) -> bool:
    for batch in whole_line_batches(data):
        view = memoryview(batch)
        while view:
            try:
                n = os.write(fd, view)
            except InterruptedError:
                continue
            except OSError:
                return False
            view = view[n:]
    return True


def whole_line_prints() -> None:
    """Each ``print`` of this process one write: under ``PYTHONUNBUFFERED`` (Metaflow sets it for a task, and
    so for its ranks) ``print()`` writes its text and its newline apart, and a process sharing the pipe (a
    rank of the same node, another local node's task) lands between them: two lines become one."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # not a TextIOWrapper (replaced by a test or a library), or closed
            pass


def prefix_lines(data: bytes, label: bytes) -> bytes:
    """``label`` at the start of each line, but of a line torch has labelled already: after its process
    group starts, its C++ log lines begin ``[rank0]:[W...`` and its excepthook's ``[rank0]: ``."""
    if not label:
        return data
    out = label + data[:-1].replace(b"\n", b"\n" + label) + data[-1:]
    torchs = label.rstrip()
    if torchs not in data:  # the common case: one scan, no copy
        return out
    doubled = label + torchs
    if out.startswith(doubled):
        out = out[len(label):]
    return out.replace(b"\n" + doubled, b"\n" + torchs)


class LineSplitter:
    """Hands on whole lines only; the rest waits for its newline or the end."""

    def __init__(self, label: bytes = b"", end_long_lines: bool = True):
        self.label = label
        # Past MAX_LINE: a line of its own (a label starts each line), or as it is (the pump adds no bytes).
        self.end_long_lines = end_long_lines
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        data = self.pending + data
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) < MAX_LINE:
                self.pending = data
                return b""
            if not self.end_long_lines:
                self.pending = b""
                return prefix_lines(data, self.label) if self.label else data
            cut = len(data) - 1
            data += b"\n"
        self.pending = data[cut + 1 :]
        return prefix_lines(data[: cut + 1], self.label)

    def finish(self) -> bytes:
        """The unterminated tail, made a line so it does not merge with the next."""
        tail, self.pending = self.pending, b""
        return prefix_lines(tail + b"\n", self.label) if tail else b""


class LogOnly:
    """The lines between the markers go to the log only; the markers nowhere."""

    def __init__(self) -> None:
        self.quiet = False

    def split(self, lines: bytes) -> Tuple[bytes, bytes]:
        if not self.quiet and b"\x00mftr-log-only-" not in lines:
            return lines, lines  # the common case: no copy, no scan per line
        console, log = [], []
        for line in lines.splitlines(keepends=True):
            if line == LOG_ONLY_BEGIN:
                self.quiet = True
            elif line == LOG_ONLY_END:
                self.quiet = False
            else:
                log.append(line)
                if not self.quiet:
                    console.append(line)
        return b"".join(console), b"".join(log)


class RankStream:
    """One of a rank's two outputs on its way to the console and its log."""

    def __init__(self, out_fd: int, splitter: LineSplitter, log_fd: Optional[int]) -> None:
        self.out_fd, self.splitter, self.log_fd = out_fd, splitter, log_fd
        # The label goes on the console's lines only; the log keeps the text as written.
        self.label, splitter.label = splitter.label, b""
        self.quiet = LogOnly()
        self.redraw = Redraw()

    def take(self, data: bytes, now: float) -> bool:
        """False once done: ``data`` b"" (the end), or nobody reads the console."""
        whole = self.splitter.feed(data) if data else self.splitter.finish()
        console, logged = self.quiet.split(whole) if whole else (b"", b"")
        if whole:
            console = self.redraw.end_line(console)
        drawn, self.splitter.pending = self.redraw.take(self.splitter.pending, show=not self.quiet.quiet, now=now)
        console += self.redraw.show(now) if data else self.redraw.flush()
        self._log(logged + drawn)
        return self._console(console) and bool(data)

    def tick(self, now: float) -> bool:
        return self._console(self.redraw.show(now))

    def _log(self, data: bytes) -> None:
        if self.log_fd is not None and data:
            try:
                os.write(self.log_fd, data)
            except OSError:
                pass

    def _console(self, lines: bytes) -> bool:
        return not lines or write_all(self.out_fd, prefix_lines(lines, self.label))

    def close(self, fd: int) -> None:
        os.close(fd)
        if self.log_fd is not None:
            os.close(self.log_fd)


def _wait(streams: Dict[int, RankStream]) -> Optional[float]:
    due = [at for at in (s.redraw.due() for s in streams.values()) if at is not None]
    return max(0.0, min(due) - time.monotonic()) if due else None


def _run(streams_in: Dict[int, Tuple[int, LineSplitter, Optional[int]]]) -> None:
    streams = {fd: RankStream(*plan) for fd, plan in streams_in.items()}
    while streams:
        try:
            ready, _, _ = select.select(list(streams), [], [], _wait(streams))
        except InterruptedError:
            continue
        now = time.monotonic()
        most = 0
        for fd in ready:
            try:
                data = os.read(fd, READ_SIZE)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not streams[fd].take(data, now):
                streams.pop(fd).close(fd)  # ended, or nobody reads us any more
            most = max(most, len(data))
        for fd, stream in list(streams.items()):
            if fd not in ready and not stream.tick(now):
                streams.pop(fd).close(fd)
        settle_after(most)


def start(rank: int, labels: bool, log_dir: Optional[str]) -> bool:
    """Before any thread exists: fork copies only the calling thread."""
    label = b"[rank%d]: " % rank if labels else b""
    plan = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        log_fd = None
        if log_dir:
            try:
                log_fd = open_private(rank_log_path(log_dir, rank, name))
            except OSError:
                log_fd = None
        plan[fd] = (r, w, log_fd)
    pid = os.fork()
    if pid == 0:  # the relay
        try:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            os.setpgid(0, 0)  # out of the rank's group: a killpg of the rank spares us
            streams = {}
            for fd, (r, w, log_fd) in plan.items():
                os.close(w)
                streams[r] = (os.dup(fd), LineSplitter(label), log_fd)
            _run(streams)
        finally:
            os._exit(0)
    for fd, (r, w, log_fd) in plan.items():
        os.dup2(w, fd)
        os.close(w)
        os.close(r)
        if log_fd is not None:
            os.close(log_fd)
    return True
