"""Running real flows from tests, and proving afterwards that nothing was left.

Every process a test starts inherits a unique token in its environment; after the
test, any live process whose environment holds the token is a leak.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional

from our_processes import TOKEN_VAR, describe, kill_all, leaks, processes_with_token  # noqa: F401 (shared)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOWS = os.path.join(REPO, "tests", "flows")
def _terminal_signals() -> None:
    """In the child, before exec: Ctrl-C and Ctrl-\\ as a terminal delivers them.
    A test runner started in the background by a non-interactive shell has
    them ignored, and an ignored signal stays ignored across exec: the flow
    would never see the test's Ctrl-C."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Gang:
    """A test's sandbox: its own datastore, output dir and process token."""

    def __init__(self, tmp_path):
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
        this test's datastore; return ``result`` via JSON."""
        program = (
            "import json\nfrom metaflow import Flow, namespace\nnamespace(None)\n"
            + code
            + "\nprint('@@RESULT@@' + json.dumps(result))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", program], cwd=self.tmp, env=self.env,
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        line = [l for l in proc.stdout.splitlines() if l.startswith("@@RESULT@@")][-1]
        return json.loads(line[len("@@RESULT@@"):])

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
