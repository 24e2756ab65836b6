import json
import os
import subprocess
from dataclasses import dataclass
from typing import Iterator

import pytest

from .helpers import Gang, describe, output


@pytest.fixture
def gang(tmp_path):
    """A sandbox for one test; fails the test if any of its processes survive."""
    g = Gang(tmp_path)
    try:
        yield g
    finally:
        leaked = g.leaks()
        g.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)


@dataclass
class SharedRun:
    """One real 2 x 2 run that several tests read, each asserting its own
    behaviour: a flow costs about 28 CPU-s, and CI has 2 cores for 30 minutes."""

    gang: Gang
    proc: subprocess.CompletedProcess
    text: str
    tmpdir: str  # the run's TMPDIR: what it leaves there is the test's to see


def _shared_run(factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[SharedRun]:
    gang = Gang(factory.mktemp(name))
    tmpdir = os.path.join(gang.tmp, "tmp")
    os.makedirs(tmpdir)
    gang.env.pop("METAFLOW_TORCHRUN_DEBUG", None)  # the debug channel is off unless asked for
    try:
        proc = gang.run(*args, env={"TMPDIR": tmpdir}, timeout=240)
        leaked = gang.leaks()
    finally:
        gang.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)
    yield SharedRun(gang, proc, output(proc), tmpdir)


@pytest.fixture(scope="session")
def succeeded_run(tmp_path_factory) -> Iterator[SharedRun]:
    """gang_flow.py's defaults: report.py on 2 nodes x 2 processes, succeeding."""
    yield from _shared_run(tmp_path_factory, "succeeded")


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory) -> Iterator[SharedRun]:
    """fail.py: rank 2 (node 1, local rank 0) raises ValueError("boom from rank 2")."""
    yield from _shared_run(tmp_path_factory, "failed", "--script", "fail.py",
                           "--script-args", json.dumps({"rank": 2}))
