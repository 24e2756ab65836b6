"""Run one node's torchrun to the end and leave nothing behind. The agent has its own
process group (Ctrl-C reaches it only through us) and dies with this task; one thread
per stream pumps raw bytes, so no pipe fills and blocks the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, List, Mapping, NamedTuple, Optional, Sequence, Set, Union

from ..host import log, proctree
from ..procs.names import ZYGOTE_NAME
from ..procs import relay
from ..host.console import rank_output
from ..errors import TorchrunInterrupted
from ..base import timeouts

_log = log.get("runtime.supervisor")

ChunkSink = Callable[[bytes], None]


class GracefulStop(NamedTuple):
    """A gang's stop that gives the ranks time to save (a node was told to stop);
    a plain reason from ``should_stop`` stops them at once (a failure elsewhere)."""

    reason: str
    grace: float


StopReason = Union[str, GracefulStop]

# Raised by a signal's handler while this task waited (Ctrl-C, @timeout's SIGALRM): a gang-wide stop.
TOLD_BY = ("KeyboardInterrupt", "TimeoutException", "SystemExit")


def _default_sink(stream) -> ChunkSink:
    """The task's own stream, live. Whole lines in writes of at most PIPE_BUF
    bytes: on a pipe a local run's nodes share, no line is cut."""
    out: BinaryIO = getattr(stream, "buffer", stream)
    try:
        fd: Optional[int] = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None

    def write_now(chunk: bytes) -> None:
        try:
            if fd is not None:
                out.flush()
                relay.write_all(fd, chunk)
            else:
                out.write(chunk)
                out.flush()
        except (OSError, ValueError):
            pass  # a closed task stream must not kill the job it reports on

    return lambda chunk: rank_output(stream, lambda: write_now(chunk))  # never inside a line of ours, nor ours in it


def _pump(fd: int, sink: ChunkSink) -> None:
    """Forward whole lines as they complete; an unterminated tail at the end."""
    lines = relay.LineSplitter(end_long_lines=False)
    try:
        while True:
            try:
                chunk = os.read(fd, relay.READ_SIZE)
            except OSError:
                break
            if not chunk:
                break
            complete = lines.feed(chunk)
            if complete:
                sink(complete)
            relay.settle_after(len(chunk))
        if lines.pending:
            sink(lines.pending)
    finally:
        os.close(fd)


def _watched(sup: "Supervisor", sink: ChunkSink) -> ChunkSink:
    """``sink``, noting when the job last wrote (hang detection) and when a rank
    first wrote a labelled line (the goodput ledger's end of start-up)."""

    def seen(chunk: bytes) -> None:
        sup.last_output = time.monotonic()
        if sup.first_output is None and chunk.startswith(b"[rank"):
            sup.first_output = time.time()
        sink(chunk)

    return seen


class Supervisor:
    """Owns the torchrun agent process, its descendants and its output pumps."""

    def __init__(self, argv: List[str], env: Optional[Mapping[str, str]] = None,
                 grace_seconds: float = timeouts.PEER_STOP_GRACE, stdout_sink: Optional[ChunkSink] = None,
                 stderr_sink: Optional[ChunkSink] = None, shutdown_grace: Optional[float] = None,
                 before_stop: Optional[Callable[[], None]] = None, on_told: Optional[Callable[[str], None]] = None,
                 also_under: Optional[Callable[[], Sequence[int]]] = None):
        """``grace_seconds``: the ranks' time to stop in a fast stop (a failure);
        ``shutdown_grace``: theirs to save when this task was told to stop.
        ``before_stop`` runs before a fast stop, ranks alive. ``on_told``: this task
        told to stop tells the gang (stop.py); without it, SIGTERM raises
        ``TorchrunInterrupted``. ``also_under``: the warm processes, whose children
        are the agent and ranks (asked each look: a forked one is known once it runs, a
        warmer once it serves)."""
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.grace_seconds = grace_seconds
        self.shutdown_grace = grace_seconds if shutdown_grace is None else shutdown_grace
        self.before_stop = before_stop
        self.on_told = on_told
        self.also_under = also_under
        self._told = False
        self.signalled: Optional[int] = None  # the signal that told this task to stop
        self.last_output: Optional[float] = None  # monotonic
        self.first_output: Optional[float] = None  # epoch
        self._sinks = (_watched(self, stdout_sink or _default_sink(sys.stdout)),
                       _watched(self, stderr_sink or _default_sink(sys.stderr)))
        self.proc: Optional[subprocess.Popen] = None
        self._seen: Set[proctree.ProcId] = set()
        self._pumps: List[threading.Thread] = []
        self.started_at: Optional[float] = None
        self.started_mono: Optional[float] = None
        self._tracked_at = 0.0
        self.ended_at: Optional[float] = None

    def start(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                         start_new_session=True, preexec_fn=proctree.die_with_parent)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self.started_at = time.time()
        self.started_mono = self.last_output = time.monotonic()
        _log.debug("torchrun's agent started: pid %d", self.proc.pid)
        me = proctree.process_id(self.proc.pid)
        if me:
            self._seen.add(me)
        for fd, sink in zip((out_r, err_r), self._sinks):
            t = threading.Thread(target=_pump, args=(fd, sink), daemon=True)
            t.start()
            self._pumps.append(t)

    def _track(self) -> None:
        assert self.proc is not None
        warm = self.also_under() if self.also_under is not None else ()
        self._seen |= proctree.descendants(self.proc.pid, *warm, not_below=ZYGOTE_NAME)
        self._tracked_at = time.monotonic()

    def poll(self) -> Optional[int]:
        """A /proc scan reads every process on the host: each poll while the agent
        starts its workers, then once a second (every stop scans first: a safety net)."""
        assert self.proc is not None
        now = time.monotonic()
        if (self.started_mono is None or now - self.started_mono < timeouts.TRACK_EVERY_POLL_FOR
                or now - self._tracked_at >= timeouts.TRACK_INTERVAL):
            self._track()
        return self.proc.poll()

    def wait(self, should_stop: Optional[Callable[[], Optional[StopReason]]] = None, interval: float = 0.1) -> int:
        """Wait for the agent; SIGTERM to this task, or a reason ``should_stop``
        returns (a failure elsewhere), stops the job cleanly."""
        assert self.proc is not None
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self._told_to_stop) if in_main else None
        try:
            while True:
                code = self.poll()
                if code is not None:
                    _log.debug("torchrun's agent ended with %d after %.3fs", code, self._ran())
                    return code
                if self.signalled is not None:
                    tell(self, signal.Signals(self.signalled).name)
                reason = should_stop() if should_stop is not None else None
                if reason:
                    self.stop(reason.grace if isinstance(reason, GracefulStop) else None)
                    return self.proc.returncode
                try:
                    self.proc.wait(timeout=interval)  # its end seen at once, not a tick later
                except subprocess.TimeoutExpired:
                    pass
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                self.signalled = signal.SIGINT  # Ctrl-C: a stop asked for, like SIGTERM
            if self.on_told is not None and type(e).__name__ in TOLD_BY:
                stop_told(self, type(e).__name__, should_stop)
            raise
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)

    def _told_to_stop(self, signum, frame):
        self.signalled = signum
        if self.on_told is not None:
            return  # the wait loop tells the gang, outside the handler
        raise TorchrunInterrupted("the step received %s while torchrun was running: its ranks got SIGTERM and up to "
                                  "%g s (shutdown_grace) to stop, e.g. to save a checkpoint, before SIGKILL."
                                  % (signal.Signals(signum).name, self.shutdown_grace))

    def live_pids(self) -> Set[int]:
        if self.proc is None:
            return set()
        self._track()
        return {p[0] for p in proctree.alive(self._seen)}

    def stop(self, grace: Optional[float] = None) -> None:
        """SIGTERM the agent, then SIGKILL all that is left, ``grace`` (a graceful stop) or ``grace_seconds`` later."""
        if self.proc is None:
            return
        began = time.monotonic()
        if self.proc.poll() is None:
            _log.debug("stop begun after %.3fs (%s)", self._ran(),
                       "a graceful stop" if grace is not None else "told to stop: SIGTERM"
                       if self.signalled is not None else "the gang stopped")
            self._track()
            if self.before_stop is not None and grace is None:
                try:
                    self.before_stop()
                except Exception:  # what it reports is a bonus: the stop must happen
                    _log.debug("before the stop: where the ranks were, not collected", exc_info=True)
            # The agent gives its ranks its shutdown timeout before SIGKILL; the margin is its own.
            wait = grace + timeouts.AGENT_MARGIN if grace is not None else (
                self.shutdown_grace + timeouts.AGENT_MARGIN if self.signalled is not None else self.grace_seconds)
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            deadline = time.monotonic() + wait
            while self.proc.poll() is None and time.monotonic() < deadline:
                self._track()
                time.sleep(0.05)
            _log.debug("the agent %s %.3fs after the stop began (grace %gs)",
                       "ended" if self.proc.poll() is not None else "outlived its grace", time.monotonic() - began,
                       wait)
        self.kill_all()
        _log.debug("stop ended in %.3fs", time.monotonic() - began)

    def _ran(self) -> float:
        return time.monotonic() - self.started_mono if self.started_mono is not None else 0.0

    def kill_all(self) -> None:
        """SIGKILL the agent, drain the ranks' last output, SIGKILL every descendant ever seen, reap."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._track()
            proctree.kill_group(self.proc)
        deadline = time.monotonic() + timeouts.DRAIN_SECONDS
        for t in self._pumps:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        proctree.signal_all(proctree.alive(self._seen), signal.SIGKILL)
        proctree.wait_gone(self._seen, timeout=5)
        for t in self._pumps:
            t.join(timeout=5)
        if self.ended_at is None:
            self.ended_at = time.time()

    def __enter__(self) -> "Supervisor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_told(sup: Supervisor, what: str, should_stop: Optional[Callable[[], Optional[StopReason]]]) -> None:
    """An exception ends the wait (Ctrl-C, ``@timeout``'s): the gang is told
    and the ranks get the grace before it goes on up."""
    if sup.proc is None or sup.proc.poll() is not None:
        return
    tell(sup, what)
    reason = should_stop() if should_stop is not None else None
    sup.stop(reason.grace if isinstance(reason, GracefulStop) else sup.shutdown_grace)


def tell(sup: Supervisor, what: str) -> None:
    """Once: hand this task's being told to stop to ``on_told`` (the gang)."""
    if sup.on_told is not None and not sup._told:
        sup._told = True
        sup.on_told(what)
