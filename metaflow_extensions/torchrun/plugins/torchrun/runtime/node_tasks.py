"""A local control's node tasks: each dies with the control, its exit seen as it happens,
its stderr passed on whole, its last lines kept to name a node that died unjoined, and, once
the gang has stopped, the root cause's words passed on before the echoes (``Echoes``).
"""

from __future__ import annotations

import atexit
import collections
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

from ..cause import Cause, CauseKind
from ..gang.membership import NodeEnd
from ..host import proctree
from ..launch.command import ZYGOTE_MODULE
from ..procs import relay
from ..procs.names import ZYGOTE_PID_SUFFIX
from ..base import timeouts

# What a node's end keeps of its stderr: its last lines, each cut to this many characters.
KEPT_LINES = 12
KEPT_LINE_CHARS = 300
# The echoes held back while the root cause is said, at most (then passed on as they come).
MAX_HELD = 1 << 20
# Causes whose node says them itself, in its own error: every other cause the control's error says.
SAID_BY_ITS_NODE = (CauseKind.RANK_FAILED, CauseKind.STEP_FAILED, CauseKind.PREEMPTED)


def speaker(cause: Cause) -> Optional[int]:
    """The node whose error says the gang's root cause on a local run's console: a worker that failed
    (or was told to stop) says it itself; None where the control's error says it (its own failure, a node
    lost or frozen, a hang: the nodes that cannot or did not see it are echoes)."""
    node = cause.node_index
    return node if cause.kind in SAID_BY_ITS_NODE and node is not None and node > 0 else None


class Echoes:
    """What a local control passes on of its nodes' stderr once the gang has stopped (pure): the lines
    of the node that says the root cause at once; every other node's held until it has said it (its
    stderr ended) or, where the control says it, until ``release`` (the control's error printed). Before
    the verdict, and after the release, every line as it comes. Metaflow prints each node's error when
    that node's step ends, and a node that only echoes the cause ends first: without this the echo
    leads the screen."""

    def __init__(self, limit: int = MAX_HELD) -> None:
        self.limit = limit
        self.holding = False
        self.done = False  # released: no hold again
        self.root: Optional[int] = None  # the worker that says the cause; None: the control
        self.held: List[bytes] = []
        self.size = 0

    def stopped(self, root: Optional[int], open_nodes: Set[int]) -> None:
        """The gang's verdict, said by ``root`` (None: the control); ``open_nodes``: the workers still
        writing. A root that has already ended has said all it will: nothing to hold for."""
        if self.holding or self.done:
            return
        if root is not None and root not in open_nodes:
            return
        self.holding, self.root = True, root

    def feed(self, node: int, lines: bytes) -> bytes:
        """What to pass on now of ``node``'s ``lines``."""
        if not self.holding or node == self.root:
            return lines
        self.held.append(lines)
        self.size += len(lines)
        return self.release() if self.size > self.limit else b""

    def ended(self, node: int) -> bytes:
        """``node``'s stderr ended: where it said the cause, what was held, now."""
        return self.release() if self.holding and node == self.root else b""

    def release(self) -> bytes:
        """The root cause has been said: what was held, in the order it came; every line as it comes from now."""
        out = b"".join(self.held)
        self.holding, self.done, self.held, self.size = False, True, [], 0
        return out


class NodeTasks:
    """The node tasks a local control started, by node index. ``returns``: how many times a node's task
    killed by SIGKILL (a host pulled, a pod evicted) is started again, as a Job controller re-creates a
    pod lost to a disruption: a task that exits with an error is not (on Kubernetes it fails its Job)."""

    def __init__(self, returns: int = 0, out: int = 2) -> None:
        """``out``: where the nodes' stderr goes on (this task's own stderr)."""
        self.out = out
        self.procs: Dict[int, subprocess.Popen] = {}
        self._commands: Dict[int, Tuple[List[str], Dict[str, str]]] = {}
        self._returns_left: Dict[int, int] = {}
        self._replaced: Set[subprocess.Popen] = set()  # killed tasks already started again
        self._returns = returns
        self._closing = threading.Event()
        self._watch: Optional[threading.Thread] = None
        self._tails: Dict[int, Deque[str]] = {}
        self._splitters: Dict[int, relay.LineSplitter] = {}
        self._open: Set[int] = set()  # nodes whose stderr has not reached its end
        self._exited_at: Dict[int, float] = {}
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._pump: Optional[threading.Thread] = None
        self._echoes = Echoes()
        self._saying = threading.Lock()  # what Echoes lets out is written in the order it let it out

    def start(self, node: int, argv: Sequence[str], env: Dict[str, str]) -> None:
        """stdin and stdout the control's, stderr through the control."""
        err_r, err_w = os.pipe()
        try:
            proc = subprocess.Popen(list(argv), env=env, stderr=err_w, preexec_fn=_die_with_control)
        except BaseException:
            os.close(err_r)
            raise
        finally:
            os.close(err_w)
        with self._lock:
            self.procs[node] = proc
            self._commands[node] = (list(argv), env)
            self._returns_left.setdefault(node, self._returns)
            self._tails[node] = collections.deque(maxlen=KEPT_LINES)
            self._splitters[node] = relay.LineSplitter(end_long_lines=False)
            self._open.add(node)
            self._selector.register(err_r, selectors.EVENT_READ, node)
            # The pump ends with the last stream it had: a start may need a new one.
            if self._pump is None:
                self._pump = threading.Thread(target=self._pump_all, name="torchrun-node-stderr", daemon=True)
                self._pump.start()
            if self._returns and self._watch is None:
                self._watch = threading.Thread(target=self._watch_all, name="torchrun-node-returns", daemon=True)
                self._watch.start()

    def _watch_all(self) -> None:
        while not self._closing.wait(timeouts.NODE_RETURN_CHECK):
            for node, proc in list(self.procs.items()):
                self._start_again(node, proc)

    def _start_again(self, node: int, proc: subprocess.Popen) -> bool:
        """``proc``, node's task, started again if it was killed by SIGKILL and may come back; whether it was."""
        with self._lock:
            if self.procs.get(node) is not proc or proc in self._replaced or proc.poll() != -signal.SIGKILL \
                    or self._closing.is_set() or self._returns_left.get(node, 0) <= 0:
                return False
            self._replaced.add(proc)  # the watch thread and wait() both look: one start again
            self._returns_left[node] -= 1
            argv, env = self._commands[node]
        said = ("@torchrun: node %d's task was killed (SIGKILL): starting it again, as Kubernetes re-creates a pod "
                "lost to a disruption\n" % node).encode()
        self._say(lambda: said)
        self.start(node, argv, env)
        return True

    def cut_off(self, node: int) -> None:
        """The gang went on without ``node``, silent past heartbeat_timeout: every process of it SIGKILLed at
        once, frozen (SIGSTOPped) ones included, which a SIGTERM would never reach; its task, killed, is
        started again like any task lost to SIGKILL, and rejoins as a returning node."""
        with self._lock:
            proc = self.procs.get(node)
        if proc is None or proc.poll() is not None:
            return
        found = node_processes(proc.pid)
        proctree.signal_all(found, signal.SIGKILL)
        said = ("@torchrun: node %d was silent past heartbeat_timeout and the gang went on without it: its task "
                "and every process below it killed (%d processes)\n" % (node, len(found))).encode()
        self._say(lambda: said)

    def stop_returns(self) -> None:
        """No task is started again from now on (the step is ending)."""
        self._closing.set()

    def ended(self) -> Dict[int, NodeEnd]:
        """The nodes whose task has exited, once their stderr has ended or ``NODE_OUTPUT_DRAIN`` after."""
        now = time.monotonic()
        found = {}
        for node, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            seen = self._exited_at.setdefault(node, now)
            with self._lock:
                drained = node not in self._open
                lines = tuple(self._tails[node])
            if drained or now - seen >= timeouts.NODE_OUTPUT_DRAIN:
                found[node] = NodeEnd(code, lines)
        return found

    def running(self) -> Dict[int, proctree.ProcId]:
        alive = {node: proctree.process_id(proc.pid) for node, proc in self.procs.items() if proc.poll() is None}
        return {node: pid for node, pid in alive.items() if pid is not None}

    def wait(self) -> Dict[int, int]:
        """Every node's exit code, once every task has ended and its stderr drained (a task killed
        meanwhile that may come back is waited for again)."""
        while True:
            procs = dict(self.procs)
            codes = {node: proc.wait() for node, proc in procs.items()}
            if not any(self._start_again(node, proc) for node, proc in procs.items()) and procs == self.procs:
                break
        self.stop_returns()
        self.drain()
        return codes

    def stopped(self, cause: Cause) -> None:
        """The gang service's verdict, before it tells any node (so before any node can echo it): the
        node that says the cause goes first. Where that is this control, the held lines follow its
        error, which Metaflow prints after the step's hooks: at this process's exit, unless the step
        goes on (``release``)."""
        with self._lock:
            open_nodes = set(self._open)
        with self._saying:
            if self._echoes.holding or self._echoes.done:
                return
            self._echoes.stopped(speaker(cause), open_nodes)
            if self._echoes.holding:  # what is still held as this task ends goes out then, not never
                atexit.register(self.release)

    def release(self) -> None:
        """The control's error is out (or its step went on): the held lines now, in their order."""
        self._say(self._echoes.release)

    def _say(self, what: Callable[[], bytes]) -> None:
        with self._saying:
            lines = what()
            if lines:
                relay.write_all(self.out, lines)

    def drain(self) -> None:
        """The ended tasks' last lines passed on (at most ``NODE_OUTPUT_DRAIN``: a descendant may hold one open)."""
        with self._lock:
            pump = self._pump
        if pump is not None:
            pump.join(timeout=timeouts.NODE_OUTPUT_DRAIN)
        with self._lock:
            if self._pump is None:
                self._selector.close()

    def _pump_all(self) -> None:
        """One thread for every node's stderr: whole lines on to the control's, the last few kept."""
        while True:
            with self._lock:
                if not self._open:
                    self._pump = None
                    return
            for key, _ in self._selector.select(timeout=1.0):
                self._read(key.fd, key.data)

    def _read(self, fd: int, node: int) -> None:
        try:
            chunk = os.read(fd, relay.READ_SIZE)
        except OSError:
            chunk = b""
        splitter = self._splitters[node]
        lines = splitter.feed(chunk) if chunk else splitter.finish()
        if lines:
            self._say(lambda: self._echoes.feed(node, lines))
            with self._lock:
                self._tails[node].extend(_kept(lines))
        if not chunk:
            self._selector.unregister(fd)
            os.close(fd)
            with self._lock:
                self._open.discard(node)
            self._say(lambda: self._echoes.ended(node))


def node_processes(task: int) -> Set[proctree.ProcId]:
    """A local node's processes: its task, the tree below it, and the warm process forked for it from the
    control's (a child of that one, not of the task: its stand-in below the task names its socket, and the
    pid is written beside it) with that one's tree."""
    found = proctree.descendants(task)
    me = proctree.process_id(task)
    for pid, _ in list(found):
        warm = _forked_warm(pid)
        if warm is not None:
            found |= proctree.descendants(warm[0]) | {warm}
    return found | ({me} if me is not None else set())


def _forked_warm(pid: int) -> Optional[proctree.ProcId]:
    """Where ``pid`` is a warm process's stand-in (``python -m ZYGOTE_MODULE SOCKET``, titled or not),
    the warm process forked in its place; else None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w.strip()]
        args = words[0].split() if len(words) == 1 else words
        if ZYGOTE_MODULE not in args or args[-1] == ZYGOTE_MODULE:
            return None
        with open(args[-1] + ZYGOTE_PID_SUFFIX, "rb") as f:
            return proctree.process_id(int(f.read(32).strip()))
    except (OSError, ValueError, IndexError):
        return None


def _kept(lines: bytes) -> List[str]:
    text = lines.decode("utf-8", errors="replace").splitlines()
    return [line[:KEPT_LINE_CHARS] + (" [...]" if len(line) > KEPT_LINE_CHARS else "") for line in text[-KEPT_LINES:]]


def _die_with_control() -> None:
    """SIGTERM when the control dies, as a stopped task gets (a node in a call stops its ranks with grace)."""
    proctree.die_with_parent(signal.SIGTERM)
