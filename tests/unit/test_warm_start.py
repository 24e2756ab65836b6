"""The step's warm process as the task starts and stops it (runtime/warm_start.py)."""

from __future__ import annotations

import os
import time

from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import Knobs
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import HOST_ZYGOTE_ENV, ZYGOTE_ENV
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


def _parent_of(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _runtime_warm_pid(monkeypatch, host):
    """Metaflow's runtime as it starts its first task, ``host`` in its environment."""
    from metaflow_extensions.torchrun.plugins.torchrun.runtime import warm_start

    monkeypatch.setenv(HOST_ZYGOTE_ENV, host)
    monkeypatch.delenv(ZYGOTE_ENV, raising=False)
    env = {}
    warm_start.share_runtime_warm(env, True)
    runtime = warm_start._RUNTIME
    assert runtime is not None and env[HOST_ZYGOTE_ENV] == runtime.path != host
    deadline = time.monotonic() + 30
    while runtime.pid == runtime.proc.pid and runtime._may_fork and time.monotonic() < deadline:
        time.sleep(0.05)  # its pid comes in a file once the host's has forked it
    return runtime


def test_a_runtime_started_beside_a_live_warm_process_forks_its_own_from_it(monkeypatch):
    """A test worker's (or any caller's) warm process: the run's is forked there, torch not imported again."""
    from metaflow_extensions.torchrun.plugins.torchrun.runtime import warm_start

    env = {k: v for k, v in os.environ.items() if k != ZYGOTE_ENV}
    host = WarmStart.for_step(True)
    try:
        host.start(env, nproc=2)
        deadline = time.monotonic() + 10
        while not os.path.exists(host.path) and time.monotonic() < deadline:
            time.sleep(0.02)
        runtime = _runtime_warm_pid(monkeypatch, host.path)
        assert runtime.pid != runtime.proc.pid and _parent_of(runtime.pid) == host.pid
        assert HOST_ZYGOTE_ENV not in runtime.environment({HOST_ZYGOTE_ENV: host.path})  # never the ranks'
    finally:
        warm_start.close_runtime_warm()
        host.close()


def test_a_runtime_named_a_warm_process_that_is_gone_or_not_a_socket_imports_its_own(monkeypatch, tmp_path):
    """A stale name (a file, nothing however long its path, a socket nobody listens on) costs no wait."""
    import socket

    from metaflow_extensions.torchrun.plugins.torchrun.runtime import warm_start

    stale = str(tmp_path / "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(stale)
    sock.close()  # bound, never listened: refused
    (tmp_path / "f").write_text("")
    for host in (str(tmp_path / "f"), str(tmp_path / "none"), "/" + "x" * 200):  # not even tried
        try:
            runtime = _runtime_warm_pid(monkeypatch, host)
            assert runtime.pid == runtime.proc.pid and ZYGOTE_ENV.encode() not in _environ(runtime.pid), host
        finally:
            warm_start.close_runtime_warm()
    try:  # tried, refused at once: it imports its own
        monkeypatch.setenv(HOST_ZYGOTE_ENV, stale)
        env = {}
        warm_start.share_runtime_warm(env, True)
        runtime = warm_start._RUNTIME
        time.sleep(1)
        assert runtime.proc.poll() is None and runtime.pid == runtime.proc.pid
    finally:
        warm_start.close_runtime_warm()


def test_the_leak_check_sees_what_a_test_worker_s_warm_process_forked_for_the_test_and_spares_it():
    """A forked process has the warm process's environment, without the test's token
    (tests/integration/helpers.py's worker_warm): it is the running test's all the same."""
    import our_processes

    env = {k: v for k, v in os.environ.items() if k not in (HOST_ZYGOTE_ENV, ZYGOTE_ENV)}
    host, forked = WarmStart.for_step(True), WarmStart.for_step(True)
    try:
        host.start(env, nproc=2)
        deadline = time.monotonic() + 10
        while not os.path.exists(host.path) and time.monotonic() < deadline:
            time.sleep(0.02)
        our_processes.watch_warm(host.pid)
        forked.start(dict(env, **{HOST_ZYGOTE_ENV: host.path, our_processes.TOKEN_VAR: "t1"}), nproc=2)
        while forked.pid == forked.proc.pid and time.monotonic() < deadline + 20:
            time.sleep(0.05)
        below = forked.pid
        assert below != forked.proc.pid and _parent_of(below) == host.pid
        assert set(our_processes.leaks("t1", grace=0)) == {forked.proc.pid, below}  # the stand-in holds the token
        our_processes.kill_all("t1")
        assert our_processes.leaks("t1", grace=10) == [] and host.proc.poll() is None
    finally:
        if host.pid in our_processes._WARM:
            our_processes._WARM.remove(host.pid)
        forked.close()
        host.close()
