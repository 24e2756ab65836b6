"""Many refused calls, one flow (issue 50, item 4): the tests that read only a
refusal's message read it from one ``refusals_flow.py`` run, each its own call.

A refused ``current.torch.run`` call raises in the step before any agent starts
(about 4 CPU-s a flow, almost all Metaflow's own tasks), so one step makes every
call in turn, catches each, and keeps its type and message per node. The run
is watched by an audit hook in every Python process of it (``AUDIT``): what it
started is each test's to check. A failing step's console screen is another
matter: those tests keep a flow of their own (call_flow.py, one per screen).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Iterator

import pytest

from our_processes import mentions_torchrun

from .calls import flow_run, once_per_pytest_run
from .helpers import Gang

# Installed in every Python process of the run (PYTHONPATH): each notes its own
# command line and every process it starts, so a test sees what started.
AUDIT = '''
import os, sys
_out = os.environ["MFTR_AUDIT_DIR"]
def _note(kind, text):
    with open(os.path.join(_out, "%d.%s" % (os.getpid(), kind)), "a") as f:
        f.write(text + "\\n")
_note("argv", repr(getattr(sys, "orig_argv", sys.argv)))
def _hook(event, args):
    if event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
        _note("spawn", "%s %r" % (event, args))
sys.addaudithook(_hook)
'''

# name -> the call's keywords (entrypoint relative to tests/flows/scripts/); the
# step's @torchrun is retry_on="infrastructure" (the "retry" call's refusal).
REFUSALS: Dict[str, dict] = {
    "typo": {"entrypoint": "reprot.py"},
    "none": {"entrypoint": None},
    "option": {"entrypoint": "report.py", "torchrun_args": {"max_restart": 2}},
    # torch 2.14+ would print a shell script and exit without a rank; 2.13 has no such option.
    "print completion": {"entrypoint": "report.py", "torchrun_args": {"print_completion": "bash"}},
    "keyword": {"entrypoint": "report.py", "entrypoint_arg": {"a": 1}},
    # Was Python's TypeError (missing 'entrypoint'): an Internal error of 67 lines (issue 52).
    "no entrypoint": {"entry_point": "report.py"},
    "every mistake": {"entrypoint": "report.py", "entrypoint_arg": {"a": 1}, "torchrun_args": {"max_restart": 2}},
    "retry_on": {"entrypoint": "report.py", "torchrun_args": {"max_restarts": 2}},
    "gpu": {"entrypoint": "report.py", "nproc_per_node": "gpu"},
    "none value": {"entrypoint": "report.py", "torchrun_args": {"max_restarts": None}},
    "directory": {"entrypoint": "", "nproc_per_node": 1},  # scripts/ itself
    "not python": {"entrypoint": "not_python.sh", "nproc_per_node": 2},
    # test_resources_and_refusals: a missing script, an argument no flag can carry.
    "missing": {"entrypoint": "no_such_script.py", "nproc_per_node": 1},
    "dict argument": {"entrypoint": "echo_args.py", "nproc_per_node": 1, "entrypoint_args": {"config": {"nested": 1}}},
    # test_from_0_2: a metaflow-torchrun 0.1 keyword, 0.2's positional order.
    "call_master_port": {"entrypoint": "report.py", "master_port": 41000},
    "positional": {"*": [{"max_restarts": 0}, "scripts/report.py"]},
}


@dataclass
class RefusalsRun:
    """One run of every call of ``REFUSALS``, read by many tests."""

    gang: Gang
    returncode: int
    text: str
    audit: Dict[str, str]  # file name (pid.argv, pid.spawn) -> what the audit hook noted

    def refusal(self, call: str, node: int = 0) -> dict:
        """``{"type": ..., "message": ...}``: what ``call`` raised on ``node``."""
        path = os.path.join(self.gang.out, "refusals", "%s-%d.json" % (call, node))
        assert os.path.exists(path), "no refusal kept for %r on node %d:\n%s" % (call, node, self.text[-4000:])
        with open(path) as f:
            return json.load(f)

    def message(self, call: str) -> str:
        """What ``call`` raised: the run went on, both nodes raised the same ``TorchrunCallRefused``."""
        assert self.returncode == 0, self.text[-4000:]
        said = [self.refusal(call, node) for node in (0, 1)]
        assert said[0] == said[1], said
        assert said[0]["type"] == "TorchrunCallRefused", said[0]
        return said[0]["message"]

    def check_nothing_started(self) -> None:
        """No process of the run started torchrun: both nodes' tasks watched, none mentions it, nor the output."""
        train_tasks = [r for name, r in self.audit.items() if name.endswith(".argv") and "'train'" in r and "'step'" in r]
        assert len(train_tasks) >= 2, self.audit  # both nodes' tasks were watched
        for name, noted in self.audit.items():
            assert not mentions_torchrun(noted), (name, noted)
        assert not mentions_torchrun(self.text), self.text


def run_refusals(factory: pytest.TempPathFactory, name: str) -> Iterator[RefusalsRun]:
    """``REFUSALS`` in one step of refusals_flow.py on 2 nodes, once for the whole pytest run."""

    def produce() -> dict:
        site, seen = factory.mktemp(name + "-site"), factory.mktemp(name + "-seen")
        (site / "sitecustomize.py").write_text(AUDIT)
        env = {"MFTR_REFUSALS": json.dumps(REFUSALS), "MFTR_TORCHRUN": json.dumps({"retry_on": "infrastructure"}),
               "MFTR_AUDIT_DIR": str(seen),
               "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
        kept = flow_run(factory, name, flow="refusals_flow.py", env=env, timeout=180)
        kept["audit"] = {p.name: p.read_text() for p in seen.iterdir()}
        return kept

    kept = once_per_pytest_run(factory, name, produce)
    yield RefusalsRun(Gang(kept["tmp"]), kept["returncode"], kept["text"], kept["audit"])
