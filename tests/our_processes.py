"""Finding the processes a test started, by what they are: one place for every
test (unit, integration, multi-host).

Two ways to know a process, neither a string copied into a test:

- whose it is: every process a test starts inherits ``TOKEN_VAR=<token>`` in its
  environment; after the test, a live process holding the token is a leak
  (``processes_with_token``);
- what it is: a torchrun agent or a rank runs ``python -m`` one of the modules
  the launcher itself names (``launch/command.py``: ``AGENT_MODULE``,
  ``BOOTSTRAP_MODULE``); a node's Metaflow task carries Metaflow's own
  ``--ubf-context`` value (``UBF_CONTROL`` / ``UBF_TASK``). Rename a module and
  these follow; a copied string would silently match nothing.

A rank shows the user's command, not ours (``host/title.py``): a forked one is
found through its stand-in, which keeps the module on its command line; a fresh
one by the call's work directory in its own environment (``WORK_DIR_ENV``, set
for torchrun's processes alone). A forked process's environment is its warm
process's, which holds the test's token too, and its parent is that warm process;
below a test worker's own warm process (``watch_warm``) it is the running test's.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Dict, List, Optional, Sequence

from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK

from metaflow_extensions.torchrun.plugins.torchrun.launch.command import AGENT_MODULE, BOOTSTRAP_MODULE, ZYGOTE_MODULE
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import WORK_DIR_ENV, ZYGOTE_NAME, ZYGOTE_PID_SUFFIX

TOKEN_VAR = "MFTR_TEST_TOKEN"
# A node's torchrun: its agent and the ranks the agent starts.
TORCHRUN_MODULES = (AGENT_MODULE, BOOTSTRAP_MODULE)


def _state(pid: int) -> Optional[bytes]:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _pids() -> List[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid()]


def _environ(pid: int) -> List[bytes]:
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


_WARM: List[int] = []  # this test worker's warm process (tests/integration/helpers.py)


def watch_warm(pid: int) -> None:
    """What this worker's warm process forks holds its environment, not a test's token:
    the tests of a worker run one at a time, so what lives below it is the running test's.
    It is never one of them itself: no test kills it."""
    _WARM.append(pid)


def processes_with_token(token: str) -> List[int]:
    """Live (not zombie) processes whose environment holds this test's token, and those
    this worker's warm process forked for it."""
    needle = ("%s=%s" % (TOKEN_VAR, token)).encode()
    found = []
    below = {p for root in _WARM for p in descendants(root)} if _WARM else set()
    for pid in _pids():
        if pid not in below and needle not in _environ(pid):
            continue
        state = _state(pid)
        if state is not None and state != b"Z":
            found.append(pid)
    return found


def leaks(token: str, grace: float = 5.0) -> List[int]:
    """The test's processes still alive ``grace`` seconds from now (or as soon
    as there are none): what a test left behind."""
    deadline = time.monotonic() + grace
    left = processes_with_token(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_with_token(token)
    return left


def kill_all(token: str) -> None:
    """SIGKILL every process of the test still alive."""
    for pid in processes_with_token(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def argv(pid: int) -> List[str]:
    """A process's command line as a list ([] when it is gone). A title written
    over it (host/title.py) is one string: split at its blanks, as ps shows it."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return []
    words = [a.decode(errors="replace") for a in data.split(b"\0") if a.strip()]
    return words[0].split() if len(words) == 1 else words


def describe(pids: Sequence[int]) -> str:
    """One line per process: pid and command line."""
    return "\n".join("%d: %s" % (pid, " ".join(argv(pid))[:240]) for pid in pids if argv(pid))


def is_torchrun(pid: int) -> bool:
    """A torchrun agent or one of its ranks: ``python -m <one of TORCHRUN_MODULES>``
    (a fresh one, or the stand-in of a forked one), or a fresh rank titled with
    the user's command, which torchrun gave the call's work directory."""
    if any(module in argv(pid) for module in TORCHRUN_MODULES):
        return True
    return any(entry.startswith(WORK_DIR_ENV.encode() + b"=") for entry in _environ(pid))


def torchrun_processes(token: str) -> List[int]:
    """This test's torchrun agents and ranks, on any host."""
    return [pid for pid in processes_with_token(token) if is_torchrun(pid)]


def wait_until_no_torchrun(token: str, timeout: float) -> float:
    """``time.monotonic()`` when none of this test's torchrun processes is left;
    AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not torchrun_processes(token):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError("torchrun processes still alive after %ds:\n%s"
                         % (timeout, describe(torchrun_processes(token))))


def mentions_torchrun(text: str) -> bool:
    """Whether a run's output shows a torchrun started: its command, a rank's
    label. For the tests of what is refused before anything starts."""
    return any(m in text for m in TORCHRUN_MODULES + ("torch.distributed.run", "[rank"))


def descendants(root: int) -> List[int]:
    """Every live process below ``root`` (one scan of /proc)."""
    children: Dict[int, List[int]] = {}
    for pid in _pids():
        ppid = _parent(pid)
        if ppid:
            children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _name(pid: int) -> bytes:
    try:
        with open("/proc/%d/comm" % pid, "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def node_processes(task: int) -> List[int]:
    """A local node's processes, as a host would hold them: its task's tree,
    with its warm process's when that was forked from the control's
    (runtime/warm_start.py), and without another node's below its own."""
    mine = [p for p in descendants(task)]
    # Another node's warm process names its own socket; a warmer (procs/warm_imports.py) is this node's,
    # with its parent's command line.
    forked = {p for p in mine if _name(p) == ZYGOTE_NAME and _name(_parent(p)) == ZYGOTE_NAME
              and argv(p) != argv(_parent(p))}
    for p in forked:
        mine = [q for q in mine if q != p and q not in descendants(p)]
    for p in list(mine):
        args = argv(p)
        if ZYGOTE_MODULE in args and args[-1] != ZYGOTE_MODULE:
            try:
                with open(args[-1] + ZYGOTE_PID_SUFFIX) as f:
                    warm = int(f.read())
            except (OSError, ValueError):
                continue
            mine += [warm] + descendants(warm)
    return mine


def _parent(pid: int) -> int:
    """Its parent's pid; 0 once it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def is_node_task(pid: int, control: bool) -> bool:
    """A node's Metaflow task (``step ... --ubf-context <ctx>``): the control's
    with ``control``, else a worker's."""
    args = argv(pid)
    if "step" not in args or "--ubf-context" not in args:
        return False
    i = args.index("--ubf-context")
    return i + 1 < len(args) and args[i + 1] == (UBF_CONTROL if control else UBF_TASK)


def node_tasks(root: int, control: bool) -> List[int]:
    """The node tasks below ``root`` (a local run's ``flow.py run``)."""
    return [pid for pid in descendants(root) if is_node_task(pid, control)]
