"""Run one node's torchrun to the end and leave nothing behind.

The agent runs in its own process group (so a terminal's Ctrl-C reaches it only
through us, in order) and dies with this task (``PR_SET_PDEATHSIG``). Its output
is pumped by one thread per stream, as raw bytes: neither stream can fill its
pipe and block the job while we wait on the other, nothing is decoded (so no
byte is lost to an encoding error) and both are drained to EOF before we return.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, List, Mapping, Optional, Set

from ..host import proctree
from ..procs import relay
from ..host.console import rank_output
from ..errors import TorchrunInterrupted

ChunkSink = Callable[[bytes], None]

# How often the agent's process tree is scanned (see Supervisor._track_now).
TRACK_EVERY_POLL_FOR = 3.0
TRACK_INTERVAL = 1.0
# Beyond a graceful shutdown's grace: the agent's own time to SIGKILL the ranks
# that did not stop and to exit.
AGENT_MARGIN = 2.0


def _default_sink(stream) -> ChunkSink:
    """Write to the task's own stream, as bytes, live. Whole lines go out in
    writes of at most PIPE_BUF bytes, so on a pipe shared with other writers (the
    other nodes of a local run share the control task's) no line is cut."""
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

    def write(chunk: bytes) -> None:
        rank_output(stream, lambda: write_now(chunk))  # never inside a line of ours, nor ours inside it

    return write


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
        tail = lines.pending
        if tail:
            sink(tail)
    finally:
        os.close(fd)


class Supervisor:
    """Owns the torchrun agent process, its descendants and its output pumps."""

    def __init__(
        self,
        argv: List[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        grace_seconds: float = 3.0,
        stdout_sink: Optional[ChunkSink] = None,
        stderr_sink: Optional[ChunkSink] = None,
        shutdown_grace: Optional[float] = None,
        before_stop: Optional[Callable[[], None]] = None,
    ):
        """``grace_seconds``: how long the ranks get to stop when the job is
        stopped for a failure (elsewhere in the gang, a timeout). ``shutdown_grace``:
        how long they get when this task itself was told to stop (SIGTERM: an
        eviction, a terminated job), to save a checkpoint; torchrun's agent is
        told the same through ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``. ``before_stop``
        runs while the ranks are still alive, before any of them is signalled."""
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.grace_seconds = grace_seconds
        self.shutdown_grace = grace_seconds if shutdown_grace is None else shutdown_grace
        self.before_stop = before_stop
        # The signal that told this task to stop while the job ran, if any.
        self.signalled: Optional[int] = None
        # When the job last wrote anything (monotonic): hang detection reads it.
        self.last_output: Optional[float] = None
        self._tail = bytearray()
        self._tail_limit = 256 * 1024
        err_sink = stderr_sink or _default_sink(sys.stderr)

        out_sink = stdout_sink or _default_sink(sys.stdout)

        def stdout_seen(chunk: bytes) -> None:
            self.last_output = time.monotonic()
            out_sink(chunk)

        def stderr_with_tail(chunk: bytes) -> None:
            self.last_output = time.monotonic()
            err_sink(chunk)
            self._tail += chunk
            if len(self._tail) > 2 * self._tail_limit:
                del self._tail[: -self._tail_limit]

        self._sinks = (stdout_seen, stderr_with_tail)
        self.proc: Optional[subprocess.Popen] = None
        self._seen: Set[proctree.ProcId] = set()
        self._pumps: List[threading.Thread] = []
        self.started_at: Optional[float] = None
        self.started_mono: Optional[float] = None
        self._tracked_at = 0.0
        self.ended_at: Optional[float] = None

    @property
    def stderr_tail(self) -> bytes:
        """The last stderr bytes: torchrun's failure report is read from here."""
        return bytes(self._tail[-self._tail_limit :])

    def start(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                preexec_fn=proctree.die_with_parent,
            )
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self.started_at = time.time()
        self.started_mono = self.last_output = time.monotonic()
        me = proctree.process_id(self.proc.pid)
        if me:
            self._seen.add(me)
        for fd, sink in zip((out_r, err_r), self._sinks):
            t = threading.Thread(target=_pump, args=(fd, sink), daemon=True)
            t.start()
            self._pumps.append(t)

    def _track(self) -> None:
        assert self.proc is not None
        self._seen |= proctree.descendants(self.proc.pid)
        self._tracked_at = time.monotonic()

    def _track_now(self) -> bool:
        """A scan of /proc costs a read per process on the host: done on every
        poll while the agent starts its workers, then once a second. Ranks die
        with their agent (the bootstrap's PDEATHSIG) and every stop scans again
        first, so the record is only a safety net for what outlives the agent."""
        now = time.monotonic()
        if self.started_mono is None or now - self.started_mono < TRACK_EVERY_POLL_FOR:
            return True
        return now - self._tracked_at >= TRACK_INTERVAL

    def poll(self) -> Optional[int]:
        assert self.proc is not None
        if self._track_now():
            self._track()
        return self.proc.poll()

    def wait(
        self,
        should_stop: Optional[Callable[[], Optional[str]]] = None,
        interval: float = 0.1,
    ) -> int:
        """Wait for the agent; SIGTERM to this task stops the job cleanly.

        ``should_stop`` is asked on every tick; a reason it returns ends the job
        (this is how a failure elsewhere in the gang reaches this node).
        """
        previous = None
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            previous = signal.signal(signal.SIGTERM, self._told_to_stop)
        try:
            while True:
                code = self.poll()
                if code is not None:
                    return code
                if should_stop is not None:
                    reason = should_stop()
                    if reason:
                        self.stop()
                        return self.proc.returncode if self.proc else -1
                time.sleep(interval)
        except KeyboardInterrupt:
            self.signalled = signal.SIGINT  # Ctrl-C: a stop asked for, like SIGTERM
            raise
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)

    def _told_to_stop(self, signum, frame):
        self.signalled = signum
        raise TorchrunInterrupted(
            "the step received %s while torchrun was running: its ranks got SIGTERM and up to %g s "
            "(shutdown_grace) to stop, e.g. to save a checkpoint, before SIGKILL."
            % (signal.Signals(signum).name, self.shutdown_grace)
        )

    def live_pids(self) -> Set[int]:
        """The agent's descendants that are alive now."""
        if self.proc is None:
            return set()
        self._track()
        return {p[0] for p in proctree.alive(self._seen)}

    def stop(self) -> None:
        """SIGTERM the agent (it stops its workers), then SIGKILL all that is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._track()
            if self.before_stop is not None:
                try:
                    self.before_stop()
                except Exception:
                    pass  # what it reports is a bonus: the stop must happen
            # torchrun's agent passes SIGTERM on to its ranks (their own process
            # groups) and gives them its shutdown timeout before SIGKILL; the
            # extra seconds here are the agent's, to see that through.
            grace = self.grace_seconds
            if self.signalled is not None:
                grace = self.shutdown_grace + AGENT_MARGIN
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass
            deadline = time.monotonic() + grace
            while self.proc.poll() is None and time.monotonic() < deadline:
                self._track()
                time.sleep(0.05)
        self.kill_all()

    def kill_all(self, drain_seconds: float = 3.0) -> None:
        """SIGKILL the agent; let the ranks' output relays drain what the ranks
        wrote last (they end when the ranks are gone); SIGKILL every descendant
        ever seen that is still there; reap; finish the pumps."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._track()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + drain_seconds
        for t in self._pumps:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        proctree.signal_all(proctree.alive(self._seen), signal.SIGKILL)
        proctree.wait_gone(self._seen, timeout=5)
        for t in self._pumps:
            t.join(timeout=5)
        if self.ended_at is None:
            self.ended_at = time.time()

    def close(self) -> None:
        """Always safe to call: whatever state the job is in, it ends here."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.stop()
        else:
            self.kill_all()

    def __enter__(self) -> "Supervisor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
