"""The step's warm process as the task starts and stops it (runtime/warm_start.py)."""

from __future__ import annotations

import os
import time

from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import Knobs
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ZYGOTE_ENV
from metaflow_extensions.torchrun.plugins.torchrun.runtime.warm_start import WarmStart


def _environ(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)


def test_switched_off_nothing_starts_and_the_agent_is_not_pointed_at_one():
    """METAFLOW_TORCHRUN_WARM_START=off, as the step's start read it, for the step and for a call."""
    warm = WarmStart.started_for_step(StepDefaults(knobs=Knobs(warm_start=False)), {"A": "1", ZYGOTE_ENV: "/stale"})
    assert warm.pid is None and ZYGOTE_ENV not in warm.environment({ZYGOTE_ENV: "/stale"})
    warm.close()
    call = WarmStart.for_call(warm, "/tmp/work", None, on=False)
    call.start({"A": "1"}, nproc=2)
    assert call.pid is None and ZYGOTE_ENV not in call.environment({ZYGOTE_ENV: "/stale"})


def test_on_it_starts_once_with_one_thread_for_many_ranks_and_goes_with_its_directory():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    warm = WarmStart.for_step(True)
    try:
        warm.start(env, nproc=4)
        pid = warm.pid
        assert pid is not None
        warm.start(env, nproc=4)  # a second call, or a restart: the same process
        assert warm.pid == pid
        assert _environ(pid).get(b"OMP_NUM_THREADS") == b"1"  # torchrun's own choice for 4 ranks a node
        path = warm.environment(env)[ZYGOTE_ENV]
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(path) and os.stat(os.path.dirname(path)).st_mode & 0o077 == 0
    finally:
        warm.close()
    assert warm.pid is None and not os.path.exists(os.path.dirname(path))
    assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split(") ")[1][0] == "Z"


def test_one_rank_a_node_leaves_the_threads_to_torch():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    warm = WarmStart.for_step(True)
    try:
        warm.start(env, nproc=1)
        assert b"OMP_NUM_THREADS" not in _environ(warm.pid)
    finally:
        warm.close()


def test_a_warm_process_no_host_forked_is_its_own_pid_and_no_file_is_read_for_it(tmp_path):
    """Its pid comes in a file only from a host's zygote (a cluster's task has none):
    a file there is not looked for on every scan of the supervisor, nor believed."""
    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import HOST_ZYGOTE_ENV, ZYGOTE_PID_SUFFIX

    env = {k: v for k, v in os.environ.items() if k not in (HOST_ZYGOTE_ENV, ZYGOTE_ENV)}
    warm = WarmStart.for_step(True)
    try:
        warm.start(env, nproc=1)
        with open(warm.path + ZYGOTE_PID_SUFFIX, "w") as f:
            f.write("%d\n" % os.getpid())  # not its pid
        assert warm.pid == warm.proc.pid
    finally:
        warm.close()
