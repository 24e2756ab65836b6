"""Running real flows from tests, and proving afterwards that nothing was left.

Every process a test starts inherits a unique token in its environment; after the
test, any live process whose environment holds the token is a leak.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, Iterator, List, Mapping, Optional

import client_read
import extras
from our_processes import TOKEN_VAR, describe, kill_all, leaks, processes_with_token, watch_warm  # noqa: F401 (shared)

from metaflow_extensions.torchrun.plugins.torchrun.procs.names import HOST_ZYGOTE_ENV, ZYGOTE_ENV
from metaflow_extensions.torchrun.plugins.torchrun.runtime.warm_start import WarmStart

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOWS = os.path.join(REPO, "tests", "flows")
_WARM: Dict[str, WarmStart] = {}  # this test worker's warm processes, by PYTHONPATH, each started with its first Gang


def worker_warm(pythonpath: str = "", base: Optional[Mapping[str, str]] = None) -> str:
    """The socket of this worker's warm process (the product's own, procs/zygote.py)
    for runs with this ``PYTHONPATH``: every run's warm process forks from it
    (runtime/warm_start.py), so the worker imports torch once, not once a flow (~1.6
    CPU-s each). A warm process serves only runs whose environment torch's import
    would read the same (``zygote.refusal``), hence one per ``PYTHONPATH`` (extras.py's
    runs have their own), and one started in ``base`` instead of the worker's
    environment (the multi-host tests' hosts start from scratch, as a pod does; what
    it forks for a host joins the host's namespaces, host/namespaces.py). It dies with
    the worker; what it forks is each test's (our_processes.watch_warm)."""
    if os.environ.get("MFTR_TEST_WORKER_WARM") == "off":  # each run imports torch itself: to measure, to compare
        return ""
    key = pythonpath if base is None else "base:" + pythonpath
    warm = _WARM.get(key)
    if warm is None:
        source = os.environ if base is None else base
        env = {k: v for k, v in source.items() if k not in (TOKEN_VAR, HOST_ZYGOTE_ENV, ZYGOTE_ENV, "PYTHONPATH")}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        warm = _WARM[key] = WarmStart.for_step(True)
        warm.start(env, 2)  # as the runtime starts its own: OMP_NUM_THREADS=1
        atexit.register(warm.close)
        deadline = time.monotonic() + 30
        while warm.pid and not os.path.exists(warm.path) and time.monotonic() < deadline:
            time.sleep(0.01)  # bound before it imports torch: a run's hand-off waits in its backlog
        if warm.pid:
            watch_warm(warm.pid)
            _wait_warmed(warm.path, env)
    return warm.path if warm.pid and os.path.exists(warm.path) else ""


def _wait_warmed(path: str, env: Mapping[str, str], timeout: float = 120) -> None:
    """Until the worker's warm process has imported torch: a first test's run would wait for it
    inside its own clocks. A worker's first test runs as every worker starts (pytest's imports
    and collection, the other workers' first runs): two CI runs' function gangs were stopped by a
    hang_timeout of 10 s, then 20 s, before any rank started. A step's warm process, forked from
    it as runs do (runtime/warm_start.py), shows that it serves: the fork writes its pid."""
    probe = WarmStart.for_step(True)
    probe.start(dict(env, **{HOST_ZYGOTE_ENV: path}), 2)
    try:
        deadline = time.monotonic() + timeout
        while probe.proc is not None and probe.proc.poll() is None and time.monotonic() < deadline:
            if probe.pid not in (None, probe.proc.pid):
                return
            time.sleep(0.05)
    finally:
        probe.close()


def worker_warm_pid() -> Optional[int]:
    """This worker's warm process for runs without a PYTHONPATH, once a Gang started
    it: what it forks has its environment."""
    warm = _WARM.get("")
    return warm.pid if warm is not None else None


def _terminal_signals() -> None:
    """In the child, before exec: Ctrl-C and Ctrl-\\ as a terminal delivers them.
    A test runner started in the background by a non-interactive shell has
    them ignored, and an ignored signal stays ignored across exec: the flow
    would never see the test's Ctrl-C."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Gang:
    """A test's sandbox: its own datastore, output dir and process token."""

    def __init__(self, tmp_path, checkpoint: bool = False):
        """``checkpoint``: the runs can use @checkpoint (extras.py)."""
        self.tmp = str(tmp_path)
        self.token = uuid.uuid4().hex
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.out, exist_ok=True)
        venv_bin = os.path.dirname(sys.executable)
        self.env = dict(os.environ)
        self.env.update(
            {
                TOKEN_VAR: self.token,
                "MFTR_TEST_OUT": self.out,
                "METAFLOW_DATASTORE_SYSROOT_LOCAL": self.tmp,
                "METAFLOW_USER": self.env.get("METAFLOW_USER", "tests"),
                "PATH": venv_bin + os.pathsep + self.env.get("PATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if checkpoint:
            self.env = extras.with_checkpoint(self.env)
        self.env.pop(ZYGOTE_ENV, None)
        self.env.pop(HOST_ZYGOTE_ENV, None)
        warm = worker_warm(self.env.get("PYTHONPATH", ""))
        if warm:
            self.env[HOST_ZYGOTE_ENV] = warm

    def command(self, flow: str = "gang_flow.py", *args: str, run_args=()) -> List[str]:
        return [sys.executable, os.path.join(FLOWS, flow), "--no-pylint", *args, "run", *run_args]

    def run(self, *run_args: str, flow: str = "gang_flow.py", top_args=(), timeout: float = 240,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(flow, *top_args, run_args=run_args),
            cwd=self.tmp,
            env=dict(self.env, **(env or {})),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )

    def start(self, *run_args: str, flow: str = "gang_flow.py", top_args=()) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(flow, *top_args, run_args=run_args),
            cwd=self.tmp,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so a test can Ctrl-C it like a terminal would
            preexec_fn=_terminal_signals,
        )

    def reports(self, prefix: str) -> Dict[int, object]:
        found = {}
        for name in os.listdir(self.out):
            if name.startswith(prefix) and name.endswith(".json"):
                with open(os.path.join(self.out, name)) as f:
                    found[int(name[len(prefix):-5])] = json.load(f)
        return found

    def wait_for_reports(self, prefix: str, count: int, timeout: float) -> Dict[int, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.reports(prefix)
            if len(found) >= count:
                return found
            time.sleep(0.2)
        raise AssertionError("only %d of %d %s reports after %ds" % (len(self.reports(prefix)), count, prefix, timeout))

    def client(self, code: str) -> object:
        """Evaluate ``code`` (which sets ``result``) with the Metaflow client on
        this test's datastore; return ``result`` via JSON (tests/client_read.py)."""
        return client_read.read(self.tmp, code)

    def leaks(self, grace: float = 5.0) -> List[int]:
        return leaks(self.token, grace)

    def kill_everything(self) -> None:
        kill_all(self.token)


def finish_or_explain(proc: subprocess.Popen, gang: "Gang", timeout: float) -> bytes:
    """``proc``'s output once it ends; if it does not end within ``timeout``,
    a failure that shows what it printed and every process of the test still
    alive, with its state and where in the kernel it waits, so that a run that
    does not stop can be diagnosed from CI's log alone."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out
    except subprocess.TimeoutExpired as e:
        printed = (e.output or b"").decode(errors="replace")[-6000:]
        alive = []
        for pid in processes_with_token(gang.token):
            try:
                with open("/proc/%d/wchan" % pid) as f:
                    wchan = f.read().strip()
                with open("/proc/%d/stat" % pid) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            alive.append("%s [%s, waits in %s]" % (describe([pid]), state, wchan or "-"))
        raise AssertionError("did not end within %ds.\nStill alive:\n%s\nIt printed:\n%s"
                             % (timeout, "\n".join(alive) or "(none)", printed)) from None


def output(proc) -> str:
    data = (proc.stdout or b"") + (proc.stderr or b"")
    return data.decode(errors="replace") if isinstance(data, bytes) else data


# Metaflow's prefix on each line of a task's output: "2026-11-23 13:14:13.482 [run/step/task (pid N)] ".
_TASK_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[[^\]]*\] ?", re.M)


def without_task_prefix(text: str) -> str:
    """The task's own lines, as the task wrote them."""
    return _TASK_PREFIX.sub("", text)


# -- the failure screen (issue 36): what a user reads when a run fails ------------

# The first line that is about a failure: a traceback, a crash, an echo, our
# error or Metaflow's "<flow ...> failed:".
_FAILURE_START = re.compile(r"Traceback \(most recent call last\)|Fatal Python error|Connection closed by peer"
                            r"|failed:$|@torchrun: the gang|stopped because|First failure|Internal error")
SCREEN_BUDGET = 30
OUR_PACKAGE = "metaflow_extensions/torchrun"


def failure_screen(text: str) -> List[str]:
    """The console lines from the first failure line to Metaflow's "Task
    failed." of the step (inclusive), without Metaflow's per-line prefix."""
    lines = without_task_prefix(text).splitlines()
    start = next((i for i, line in enumerate(lines) if _FAILURE_START.search(line)), None)
    assert start is not None, "no failure line in:\n" + "\n".join(lines[-60:])
    end = next((i for i in range(start, len(lines)) if lines[i].strip() == "Task failed."), len(lines) - 1)
    return lines[start:end + 1]


def check_failure_screen(text: str, *in_order: str, once: str = "") -> List[str]:
    """What issue 36 asks of every failure: at most SCREEN_BUDGET lines after
    the first failure line, no frame of this package or of torch's launcher, no
    "Internal error" with our frames after it, ``in_order`` in this order, and
    ``once`` (the root cause's own frame line) exactly once."""
    screen = failure_screen(text)
    shown = "\n".join(screen)
    assert len(screen) <= SCREEN_BUDGET, "%d lines:\n%s" % (len(screen), shown)
    assert OUR_PACKAGE not in shown and "procs/bootstrap.py" not in shown, shown
    assert "torch/distributed/elastic" not in shown and "torch/distributed/run.py" not in shown, shown
    at = -1
    for piece in in_order:
        found = shown.find(piece, at + 1)
        assert found > at, "%r not after the previous piece in:\n%s" % (piece, shown)
        at = found
    if once:
        assert shown.count(once) == 1, "%r %d times in:\n%s" % (once, shown.count(once), shown)
        assert without_task_prefix(text).count(once) == 1, "%r more than once in the whole output" % once
    return screen


def sandbox(tmp_path, checkpoint: bool = False) -> Iterator[Gang]:
    """A test's ``Gang`` (the ``gang`` fixture's body); fails the test if any of its processes survive."""
    g = Gang(tmp_path, checkpoint=checkpoint)
    try:
        yield g
    finally:
        leaked = g.leaks()
        g.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)
