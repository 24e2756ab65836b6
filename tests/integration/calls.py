"""Many calls, one flow (issue 50): the success-path tests whose flows differed
only in the script a call runs, its arguments or its process count read one
``gang_flow.py --calls`` run, each its own call.

A flow costs about 15 CPU-s (Metaflow's tasks, each node's warm process
importing torch, the card); a call in a gang already formed costs its ranks.
Each call has its own rendezvous and log folder in the product, its ranks'
reports go to a folder of its own (``out/<name>/``), and its ``TorchrunResult``
comes back whole (``to_dict()``), so a test reads its call and nothing of the
others'. What a test reads of the console it finds by text only its call
prints. Failures stay one flow each: a call that fails ends the step.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import client_read
import pytest

from .helpers import FLOWS, Gang, describe, output

# test_local_flows: list arguments, verbatim.
LIST_ARGS = [
    "has space",
    "quote ' and \" both",
    "$(touch /tmp/mftr-pwned)",
    "`touch /tmp/mftr-pwned`",
    "semi; rm -rf /nonexistent",
    "newline\nin it",
    "ünïcödé ✓",
    "",
    "--looks-like-a-flag",
]
# test_local_flows: a dict becomes flags.
DICT_ARGS = {"lr": 0.5, "name": "a b $(x) `y`", "verbose": True, "quiet": False, "layers": [1, 2, 3]}
# test_files_and_inputs (issue 13, item 6): every prefix of a torchrun option
# that its parser used to take, some of its options in full, and the usual
# verbatim suspects.
LOOKALIKES = [
    "--log", "--max", "--start", "--run", "--master", "--local", "--monitor", "--rdzv", "--no", "--e",
    "--nnodes", "3", "--nproc-per-node=64", "--master-port", "29500", "--module", "-m",
    "--standalone", "--help", "-h", "--", "-",
]
ODD = ["has space", "quote ' and \" both", "$(touch /tmp/mftr-pwned)", "ünïcödé ✓ 日本語", "", "", "a=b"]
# test_from_0_2: None is a bare flag.
NONE_ARGS = {"lr": 0.1, "resume_ckpt": None, "use_fp16": None}
MANY_LINES = 8000  # a rank's lines, about 300 kB: far past a pipe's buffer
STEP_PRINTS = 1000  # print()s of each node's step, both nodes at once

# The calls of the ``calls_run`` fixture, in order; each test names its own.
CALLS: List[dict] = [
    {"name": "list", "script": "echo_args.py", "args": LIST_ARGS, "nproc": 1},
    {"name": "dict", "script": "echo_args.py", "args": DICT_ARGS, "nproc": 1},
    {"name": "lookalikes", "script": "echo_args.py", "args": LOOKALIKES + ODD, "nproc": 1},
    {"name": "none", "script": "echo_args.py", "args": NONE_ARGS, "nproc": 2},
    {"name": "auto", "script": "echo_args.py", "nproc": "auto"},
    {"name": "one_per_node", "script": "report.py", "nproc": None},
    {"name": "binary", "script": "binary.py", "nproc": 2},
    {"name": "many_lines", "script": "many_lines.py", "args": {"lines": MANY_LINES}, "nproc": 2},
    {"name": "modes", "script": "modes.py", "nproc": 2},
    # test_console_lines (issue 83): stars and torch's own rank label in the ranks' lines; both nodes'
    # step print() lines at the same time (gang_flow.py's step_prints).
    {"name": "console_text", "script": "console_text.py", "nproc": 2, "step_prints": STEP_PRINTS},
    # After every call whose stderr a test reads from the task's stored log: 32 MB
    # of stderr pass Metaflow's log size limit, and what comes after is cut there.
    {"name": "flood", "script": "flood_stderr.py", "args": {"mb": 8}, "nproc": 2},
    # test_step_gang: two calls of report.py in a row, each its own rendezvous.
    {"name": "report_before", "script": "report.py", "nproc": 2},
    # Last: the task's record is its last call's (test_observability, test_preflight).
    {"name": "report", "script": "report.py", "nproc": 2},
]


@dataclass
class CallsRun:
    """One run of several calls, read by many tests."""

    gang: Gang
    returncode: int
    text: str
    tmpdir: str  # the run's TMPDIR (outside gang.tmp: the per-rank logs are not the datastore's)
    results: Dict[int, Dict[str, dict]]  # node -> call -> its TorchrunResult.to_dict()

    @classmethod
    def from_kept(cls, kept: dict) -> "CallsRun":
        results = {int(node): by_call for node, by_call in (kept.get("results") or {}).items()}
        return cls(Gang(kept["tmp"]), kept["returncode"], kept["text"], kept.get("tmpdir", ""), results)

    def result(self, call: str, node: int = 0) -> dict:
        assert self.results, "the run kept no results:\n" + self.text[-4000:]
        return self.results[node][call]

    def reports(self, call: str, prefix: str) -> Dict[int, object]:
        """The reports ``call``'s ranks wrote (``Gang.reports``, in the call's own folder)."""
        found = {}
        where = os.path.join(self.gang.out, call)
        for name in os.listdir(where) if os.path.isdir(where) else []:
            if name.startswith(prefix) and name.endswith(".json"):
                with open(os.path.join(where, name)) as f:
                    found[int(name[len(prefix):-5])] = json.load(f)
        return found


def once_per_pytest_run(factory: pytest.TempPathFactory, name: str, produce: Callable[[], dict]) -> dict:
    """``produce()`` (a run, as JSON-able facts) once for the whole pytest run:
    under xdist the first worker to ask runs it while the others wait on a
    lock, then read what it kept (a session fixture is otherwise set up once per
    worker: its flow twice at ``-n 2``). A run that raised keeps nothing: the
    next worker to ask runs it again."""
    base = factory.getbasetemp()
    # pytest-xdist gives each worker a basetemp of its own under the run's.
    root = str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    with open(os.path.join(root, name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(root, name + ".json")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        kept = produce()
        with open(path + ".tmp", "w") as f:
            json.dump(kept, f)
        os.replace(path + ".tmp", path)
        return kept


def flow_run(factory: pytest.TempPathFactory, name: str, *args: str, flow: str = "gang_flow.py", top_args=(),
             env: Optional[Dict[str, str]] = None, timeout: float = 280) -> dict:
    """One real run in a sandbox of its own; fails if any process of it outlives it."""
    gang = Gang(factory.mktemp(name))
    gang.env.pop("METAFLOW_TORCHRUN_DEBUG", None)  # the debug channel is off unless asked for
    beside = _listing(FLOWS)  # a step that changes into tests/flows writes nothing there (refusals_flow.py)
    try:
        proc = gang.run(*args, flow=flow, top_args=top_args, env=env, timeout=timeout)
        leaked = gang.leaks()
    finally:
        gang.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)
    assert _listing(FLOWS) == beside, "written into the checkout: %s" % sorted(_listing(FLOWS) - beside)
    return {"tmp": gang.tmp, "returncode": proc.returncode, "text": output(proc)}


def _listing(folder: str) -> set:
    """Every path under ``folder`` but bytecode."""
    return {os.path.join(d, f) for d, dirs, files in os.walk(folder) for f in files if not f.endswith(".pyc")}


def run_calls(factory: pytest.TempPathFactory, name: str, calls: Sequence[dict], top_args=(),
              timeout: float = 280) -> Iterator[CallsRun]:
    """``calls`` in one step of gang_flow.py, once for the whole pytest run."""

    def produce() -> dict:
        tmpdir = str(factory.mktemp(name + "-tmp"))
        kept = flow_run(factory, name, "--calls", json.dumps(list(calls)), top_args=top_args,
                        env={"TMPDIR": tmpdir}, timeout=timeout)
        kept["tmpdir"] = tmpdir
        if kept["returncode"] == 0:
            by_node = client_read.read(kept["tmp"], "result = Flow('GangFlow').latest_run['join'].task['results'].data")
            kept["results"] = {node: {call: json.loads(text) for call, text in by_call.items()}
                               for node, by_call in by_node.items()}
        return kept

    yield CallsRun.from_kept(once_per_pytest_run(factory, name, produce))
