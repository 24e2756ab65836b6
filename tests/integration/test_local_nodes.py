"""A local run's other nodes, with real flows: a node whose task dies before it
joins ends the gang at once, named with its exit and its last lines; a `python`
on PATH that cannot import Metaflow is refused before any node starts, the
venv's own base interpreter included; and a control whose runtime is killed
while it waits for a node leaves nothing behind. Nothing here waits
``start_timeout`` (600 s): each run would take that long without the change."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from .helpers import check_failure_screen, finish_or_explain, output, without_task_prefix
from our_processes import describe, leaks, node_tasks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_node_task_that_exits_before_joining_fails_the_step_naming_it(gang):
    proc = gang.run(flow="step_flow.py", env={"MFTR_EXIT_AT_START": "1", "MFTR_STEP": "{}"}, timeout=240)
    text = output(proc)
    assert proc.returncode != 0, text[-4000:]
    assert "did not join" not in text and "missing for" not in text, text[-4000:]
    said = ("node 0 stopped: node 1's task ended before it joined the gang (exit code 3); "
            "its last lines of output are above, as it wrote them")
    screen = check_failure_screen(text, said, once=said)
    assert len(screen) < 15, "\n".join(screen)
    # Its last lines once: as its own stderr, passed on by the control just
    # before the error that points at them (not again in the error).
    shown, last = without_task_prefix(text), "step_flow: node 1 cannot start here (MFTR_EXIT_AT_START)"
    assert shown.count(last) == 1, shown[-4000:]
    assert shown.index(last) < shown.index(said), shown[-4000:]


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a venv: its base interpreter is the case")
def test_the_venvs_base_interpreter_as_path_python_is_refused_before_any_node_starts(gang, tmp_path):
    """The binary this venv was made from, first on PATH outside the venv (what
    `python` is where the venv is not activated): the same file as the
    control's Python, without the venv's packages."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(os.path.realpath(sys.executable))
    path = str(bare) + os.pathsep + gang.env["PATH"]
    proc = gang.run(flow="step_flow.py", env={"PATH": path, "MFTR_STEP": "{}"}, timeout=240)
    text = output(proc)
    assert proc.returncode != 0, text[-4000:]
    assert "`python` on PATH is %s, which cannot import Metaflow and @torchrun" % (bare / "python") in text, \
        text[-4000:]
    assert "No module named 'metaflow'" in text
    assert "Fix: activate the environment this flow runs in" in text
    assert "missing for" not in text and "ubf_task" not in text  # refused before any node started


def test_sigterm_to_the_run_while_the_control_waits_for_a_node_leaves_nothing(gang):
    """`flow.py run` killed (as `timeout` or a cancelled CI job kills it) while
    the control waits for a node that never joins: the control and the node
    it started end too, at once rather than at start_timeout."""
    gang.env.update({"MFTR_NEVER_START": "1", "MFTR_STEP": "{}", "METAFLOW_TORCHRUN_PROGRESS_SECONDS": "1"})
    proc = gang.start(flow="step_flow.py")
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not any(b"waiting for nodes: 1/2 joined; node 1 missing" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, b"".join(lines).decode(errors="replace")
            time.sleep(0.2)
        assert node_tasks(proc.pid, control=True) and node_tasks(proc.pid, control=False)
        os.kill(proc.pid, signal.SIGTERM)  # the runtime only, not its process group
        finish_or_explain(proc, gang, 60)
        left = leaks(gang.token, grace=30)
        assert not left, "left behind by the killed run:\n" + describe(left)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "waiting for nodes" in without_task_prefix(b"".join(lines).decode(errors="replace"))



def test_sigterm_to_the_run_while_the_gang_trains_leaves_nothing_even_without_warm_processes(gang):
    """The same in a call, with no warm process (whose chain of PDEATHSIGs from
    the runtime's own used to be what ended a running gang): the control stops
    the gang as when it is told to stop, and its node goes with it."""
    gang.env["METAFLOW_TORCHRUN_WARM_START"] = "0"
    proc = gang.start("--script", "spin.py", "--nproc", "1")
    try:
        gang.wait_for_reports("ready-", 2, timeout=180)
        os.kill(proc.pid, signal.SIGTERM)  # the runtime only
        finish_or_explain(proc, gang, 60)
        left = leaks(gang.token, grace=30)
        assert not left, "left behind by the killed run:\n" + describe(left)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
