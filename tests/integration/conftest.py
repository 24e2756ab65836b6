import json
import subprocess
from dataclasses import dataclass
from typing import Iterator

import pytest

from .calls import CALLS, CallsRun, flow_run, once_per_pytest_run, run_calls
from .helpers import Gang, sandbox
from .refusals import RefusalsRun, run_refusals


@pytest.fixture
def gang(tmp_path):
    """A sandbox for one test; fails the test if any of its processes survive."""
    yield from sandbox(tmp_path)


@dataclass
class SharedRun:
    """One real 2 x 2 run that several tests read, each asserting its own
    behaviour: a flow costs about 28 CPU-s, and CI has 2 cores for 30 minutes."""

    gang: Gang
    proc: subprocess.CompletedProcess
    text: str
    tmpdir: str  # the run's TMPDIR: what it leaves there is the test's to see


def _shared_run(factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[SharedRun]:
    """The run once for the whole pytest run (calls.once_per_pytest_run: at -n 2, not once per worker)."""
    def produce() -> dict:
        tmpdir = str(factory.mktemp(name + "-tmp"))
        return dict(flow_run(factory, name, *args, env={"TMPDIR": tmpdir}, timeout=240), tmpdir=tmpdir)

    kept = once_per_pytest_run(factory, name, produce)
    proc = subprocess.CompletedProcess([], kept["returncode"], kept["text"].encode(), b"")
    yield SharedRun(Gang(kept["tmp"]), proc, kept["text"], kept["tmpdir"])


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory) -> Iterator[SharedRun]:
    """fail.py: rank 2 (node 1, local rank 0) raises ValueError("boom from rank 2")."""
    yield from _shared_run(tmp_path_factory, "failed", "--script", "fail.py",
                           "--script-args", json.dumps({"rank": 2}))


@pytest.fixture(scope="session")
def calls_run(tmp_path_factory) -> Iterator[CallsRun]:
    """calls.CALLS, one after another in one step of gang_flow.py on 2 nodes:
    the success-path tests that differ only in their call read their own."""
    yield from run_calls(tmp_path_factory, "calls", CALLS)


@pytest.fixture(scope="session")
def refusals_run(tmp_path_factory) -> Iterator[RefusalsRun]:
    """refusals.REFUSALS, each caught in one step of refusals_flow.py on 2 nodes:
    the tests that read only a refused call's message read their own."""
    yield from run_refusals(tmp_path_factory, "refusals")
