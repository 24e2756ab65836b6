"""supervisor.py against real processes: output pumping, stopping, cleanup."""

from __future__ import annotations

import io
import json
import os
import signal
import textwrap
import threading
import time

import pytest
from proc_helpers import PY, SLEEPER_WRITING_PID, is_running, read_pid_file, wait_until

from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInterrupted
from metaflow_extensions.torchrun.plugins.torchrun.runtime.supervisor import Supervisor, _default_sink

MB = 1 << 20


class Sink:
    def __init__(self):
        self.chunks = []
        self.lock = threading.Lock()

    def __call__(self, chunk):
        assert isinstance(chunk, bytes)
        with self.lock:
            self.chunks.append(chunk)

    @property
    def data(self):
        with self.lock:
            return b"".join(self.chunks)


def supervise(code, *args, **kwargs):
    out, err = Sink(), Sink()
    sup = Supervisor([PY, "-c", code, *args], stdout_sink=out, stderr_sink=err, **kwargs)
    return sup, out, err


def run_to_end(code, *args, **kwargs):
    sup, out, err = supervise(code, *args, **kwargs)
    with sup:
        rc = sup.wait(interval=0.02)
    return rc, out.data, err.data, sup


class TestOutput:
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("stream", ["stdout", "stderr"])
    def test_20mb_on_one_stream_only(self, stream):
        code = textwrap.dedent(
            """
            import sys
            block = bytes(range(256)) * 4096  # 1 MiB, every byte value
            out = getattr(sys, sys.argv[1]).buffer
            for i in range(20):
                out.write(block)
            out.flush()
            """
        )
        t0 = time.monotonic()
        rc, out, err, _ = run_to_end(code, stream)
        assert rc == 0
        got, other = (out, err) if stream == "stdout" else (err, out)
        assert len(got) == 20 * MB
        assert got == bytes(range(256)) * 4096 * 20
        assert other == b""
        assert time.monotonic() - t0 < 30

    @pytest.mark.timeout(60)
    def test_both_streams_interleaved(self):
        # One stream full while we would be blocked reading the other deadlocks a
        # naive reader; alternate 1 MiB writes to both.
        code = textwrap.dedent(
            """
            import sys
            for i in range(8):
                sys.stdout.buffer.write(b"o" * (1 << 20)); sys.stdout.buffer.flush()
                sys.stderr.buffer.write(b"e" * (1 << 20)); sys.stderr.buffer.flush()
            """
        )
        rc, out, err, _ = run_to_end(code)
        assert rc == 0
        assert out == b"o" * 8 * MB and err == b"e" * 8 * MB

    def test_non_utf8_bytes_byte_exact(self):
        payload = b"\xff\xfe\x80 ok\n" + bytes(range(256)) + b"\r\n\x00end"
        code = (
            "import sys; p = bytes.fromhex(sys.argv[1]); "
            "sys.stdout.buffer.write(p); sys.stderr.buffer.write(p[::-1])"
        )
        rc, out, err, _ = run_to_end(code, payload.hex())
        assert rc == 0
        assert out == payload
        assert err == payload[::-1]

    @pytest.mark.parametrize("exit_call", ["os._exit(0)", "os._exit(5)", "os.kill(os.getpid(), 9)"])
    def test_last_bytes_before_exit_are_kept(self, exit_call):
        code = (
            "import os; os.write(1, b'x' * 100000 + b'last-out-no-newline'); "
            "os.write(2, b'last-err-no-newline'); " + exit_call
        )
        rc, out, err, _ = run_to_end(code)
        assert out.endswith(b"last-out-no-newline") and len(out) == 100000 + 19
        assert err == b"last-err-no-newline"

    def test_python_buffered_tail_is_flushed_at_normal_exit(self):
        rc, out, err, _ = run_to_end("import sys; sys.stdout.write('tail'); sys.stderr.write('etail')")
        assert (rc, out, err) == (0, b"tail", b"etail")

    def test_default_sink_writes_bytes_to_the_stream_buffer(self):
        raw = io.BytesIO()
        text = io.TextIOWrapper(raw, encoding="ascii")
        write = _default_sink(text)
        write(b"\xff\xfe raw")
        assert raw.getvalue() == b"\xff\xfe raw"

    def test_default_sink_survives_a_closed_stream(self):
        stream = io.BytesIO()
        stream.close()
        _default_sink(stream)(b"lost")  # must not raise


class TestExitCodes:
    @pytest.mark.parametrize(
        "code, rc",
        [
            ("pass", 0),
            ("import sys; sys.exit(7)", 7),
            ("raise SystemExit(3)", 3),
            ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9),
            ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", -11),
        ],
    )
    def test_returned_as_is(self, code, rc):
        got, _, _, sup = run_to_end(code)
        assert got == rc
        assert sup.started_at is not None and sup.ended_at is not None
        assert sup.ended_at >= sup.started_at

    def test_env_and_stdin(self):
        code = (
            "import os, sys; print(os.environ.get('MY_VAR'), "
            "repr(sys.stdin.read()), os.getpgid(0) == os.getpid(), sep='|')"
        )
        rc, out, _, _ = run_to_end(code, env={"MY_VAR": "v a l", "PATH": os.environ["PATH"]})
        assert rc == 0
        var, stdin, leader = out.decode().strip().split("|")
        assert var == "v a l"
        assert stdin == "''"  # stdin is /dev/null, never the task's terminal
        assert leader == "True"  # its own process group

    def test_argv_is_not_shell_parsed(self):
        weird = ["$(echo hi)", "`id`", "a b", "'q'", "*"]
        rc, out, _, _ = run_to_end("import sys, json; print(json.dumps(sys.argv[1:]))", *weird)
        assert json.loads(out) == weird


class TestStopping:
    def test_stop_kills_a_grandchild_in_its_own_session(self, procs, tmp_path):
        # torchrun starts its workers with start_new_session=True: killing the
        # agent's process group does not reach them.
        pidfile = str(tmp_path / "worker.pid")
        code = textwrap.dedent(
            """
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                             start_new_session=True)
            time.sleep(60)
            """
        )
        sup, _, _ = supervise(code, SLEEPER_WRITING_PID, pidfile, grace_seconds=2)
        sup.start()
        try:
            agent = procs.add(sup.proc.pid)
            worker = procs.add(read_pid_file(pidfile))
            assert os.getsid(worker) == worker != os.getsid(agent)
            t0 = time.monotonic()
            sup.stop()
            assert time.monotonic() - t0 < 5
            assert sup.proc.returncode is not None
            assert not is_running(agent)
            assert wait_until(lambda: not is_running(worker), timeout=2), "worker survived stop()"
        finally:
            sup.stop()

    def test_close_kills_workers_the_agent_left_behind(self, procs, tmp_path):
        # The agent exits on its own, leaving a worker (already seen while the
        # agent lived) re-parented away from it: closing must still kill it.
        pidfile = str(tmp_path / "worker.pid")
        code = textwrap.dedent(
            """
            import os, subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                             start_new_session=True)
            while not os.path.exists(sys.argv[2]):
                time.sleep(0.01)
            time.sleep(0.5)
            """
        )
        sup, _, _ = supervise(code, SLEEPER_WRITING_PID, pidfile)
        with sup:
            rc = sup.wait(interval=0.02)
            worker = procs.add(read_pid_file(pidfile))
            assert rc == 0
            assert is_running(worker)
        assert wait_until(lambda: not is_running(worker), timeout=2), "orphaned worker survived"

    def test_should_stop_ends_a_long_sleep_quickly(self, procs):
        sup, _, _ = supervise("import time; time.sleep(60)", grace_seconds=3)
        calls = []

        def should_stop():
            calls.append(1)
            return "stop" if len(calls) >= 3 else None

        with sup:
            procs.add(sup.proc.pid)
            t0 = time.monotonic()
            rc = sup.wait(should_stop=should_stop, interval=0.05)
            elapsed = time.monotonic() - t0
        assert rc == -signal.SIGTERM
        assert elapsed < 2
        assert len(calls) == 3

    def test_should_stop_lambda(self, procs):
        sup, _, _ = supervise("import time; time.sleep(60)")
        with sup:
            procs.add(sup.proc.pid)
            t0 = time.monotonic()
            rc = sup.wait(should_stop=lambda: "stop")
            assert time.monotonic() - t0 < 2
        assert rc != 0 and not is_running(sup.proc.pid)

    def test_falsy_should_stop_keeps_waiting(self):
        sup, _, _ = supervise("import time; time.sleep(0.3)")
        with sup:
            assert sup.wait(should_stop=lambda: None, interval=0.02) == 0

    def test_sigterm_ignored_is_escalated_to_sigkill(self, procs):
        code = textwrap.dedent(
            """
            import signal, sys, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ready", flush=True)
            time.sleep(60)
            """
        )
        sup, out, _ = supervise(code, grace_seconds=0.3)
        with sup:
            procs.add(sup.proc.pid)
            assert wait_until(lambda: b"ready" in out.data)
            t0 = time.monotonic()
            sup.stop()
            assert time.monotonic() - t0 < 3
        assert sup.proc.returncode == -signal.SIGKILL

    def test_exiting_the_block_on_error_kills_the_job(self, procs):
        sup, _, _ = supervise("import time; time.sleep(60)")
        with pytest.raises(RuntimeError):
            with sup:
                pid = procs.add(sup.proc.pid)
                raise RuntimeError("step failed")
        assert sup.proc.returncode is not None
        assert not is_running(pid)

    def test_stop_is_idempotent_and_safe_before_start(self):
        sup = Supervisor([PY, "-c", "pass"])
        sup.stop()
        sup.stop()
        sup.kill_all()
        rc, _, _, sup = run_to_end("pass")
        sup.stop()
        sup.stop()
        assert rc == 0

    def test_sigterm_to_the_task_interrupts_wait(self, procs):
        fallback_hits = []

        def fallback(signum, frame):  # only reached if wait() did not install its own
            fallback_hits.append(signum)

        previous = signal.signal(signal.SIGTERM, fallback)
        try:
            sup, _, _ = supervise("import time; time.sleep(60)")
            deadline = time.monotonic() + 5
            with sup:
                procs.add(sup.proc.pid)
                timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
                timer.start()
                try:
                    with pytest.raises(TorchrunInterrupted) as e:
                        sup.wait(should_stop=lambda: "deadline" if time.monotonic() > deadline else None)
                finally:
                    timer.cancel()
                assert "SIGTERM" in str(e.value)
                # the task's own handler is back once wait() returns
                assert signal.getsignal(signal.SIGTERM) is fallback
            assert fallback_hits == []
            assert not is_running(sup.proc.pid)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def test_wait_restores_the_sigterm_handler(self):
        before = signal.getsignal(signal.SIGTERM)
        run_to_end("pass")
        assert signal.getsignal(signal.SIGTERM) is before

    def test_wait_from_a_thread_works(self):
        result = {}
        sup, out, _ = supervise("print('hi')")
        with sup:
            t = threading.Thread(target=lambda: result.update(rc=sup.wait(interval=0.02)))
            t.start()
            t.join(10)
        assert result == {"rc": 0}
        assert out.data == b"hi\n"


def test_agent_dies_when_the_supervising_task_is_killed(procs, tmp_path):
    # SIGKILL to the task (OOM killer, the runtime's hard kill) runs no cleanup of
    # ours: the agent must still go, through PR_SET_PDEATHSIG.
    pidfile = str(tmp_path / "agent.pid")
    task_code = textwrap.dedent(
        """
        import sys, time
        import metaflow
        from metaflow_extensions.torchrun.plugins.torchrun.runtime.supervisor import Supervisor
        sup = Supervisor([sys.executable, "-c", sys.argv[1], sys.argv[2]])
        sup.start()
        time.sleep(60)
        """
    )
    env = dict(os.environ, METAFLOW_USER=os.environ.get("METAFLOW_USER", "tests"))
    task = procs.popen([PY, "-c", task_code, SLEEPER_WRITING_PID, pidfile], env=env)
    agent = procs.add(read_pid_file(pidfile, timeout=30))
    assert is_running(agent)
    task.kill()
    task.wait()
    assert wait_until(lambda: not is_running(agent), timeout=5), "agent outlived its task"


def _open_fds():
    return set(os.listdir("/proc/self/fd"))


class TestResources:
    def test_no_fd_leak_after_a_run(self):
        run_to_end("print('warm up')")
        before = _open_fds()
        for _ in range(3):
            run_to_end("print('x')")
        assert _open_fds() <= before

    def test_no_fd_leak_when_start_fails(self, tmp_path):
        before = _open_fds()
        for _ in range(3):
            sup = Supervisor([str(tmp_path / "no-such-python")])
            with pytest.raises(OSError):
                sup.start()
        assert _open_fds() <= before


class TestTracking:
    """The agent's process tree is scanned on every poll only while it starts
    its workers, then once a second: a scan reads every process on the host."""

    def test_scans_slow_down_after_the_start(self, monkeypatch):
        from metaflow_extensions.torchrun.plugins.torchrun.host import proctree

        monkeypatch.setattr(timeouts, "TRACK_EVERY_POLL_FOR", 0.3)
        scans = []
        real = proctree.descendants
        monkeypatch.setattr(proctree, "descendants", lambda pid, **kw: scans.append(pid) or real(pid, **kw))
        rc, _, _, _ = run_to_end("import time; time.sleep(3)")  # ~150 polls of 20 ms
        assert rc == 0
        assert 3 <= len(scans) < 40, len(scans)

    def test_a_worker_started_late_is_still_killed_when_the_agent_leaves_it(
        self, monkeypatch, procs, tmp_path
    ):

        monkeypatch.setattr(timeouts, "TRACK_EVERY_POLL_FOR", 0.2)
        pidfile = str(tmp_path / "worker.pid")
        code = textwrap.dedent(
            """
            import os, subprocess, sys, time
            time.sleep(0.6)  # after the start window
            subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                             start_new_session=True)
            while not os.path.exists(sys.argv[2]):
                time.sleep(0.01)
            time.sleep(2.0)  # longer than a scan interval
            """
        )
        sup, _, _ = supervise(code, SLEEPER_WRITING_PID, pidfile)
        with sup:
            assert sup.wait(interval=0.02) == 0
            worker = procs.add(read_pid_file(pidfile))
            assert is_running(worker)
        assert wait_until(lambda: not is_running(worker), timeout=2), "orphaned worker survived"


SAVE_ON_SIGTERM = textwrap.dedent(
    """
    import os, signal, sys, time
    out, save = sys.argv[1], float(sys.argv[2])
    def on_term(signum, frame):
        time.sleep(save)  # a slow checkpoint
        open(out, "w").write("saved")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
    """
)


class TestGracefulStop:
    """A real torchrun (one process, standalone): SIGTERM to the task gives the
    ranks ``shutdown_grace`` through torchrun's own shutdown timeout."""

    def _run(self, tmp_path, procs, grace, save):
        from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
        from metaflow_extensions.torchrun.plugins.torchrun.launch.prepare import rank_environment
        from plans import node_facts, script_plan

        script = tmp_path / "save.py"
        script.write_text(SAVE_ON_SIGTERM)
        saved = tmp_path / "saved"
        env = rank_environment(os.environ, StepDefaults(label_logs=False, shutdown_grace=grace), script_plan(),
                               node_facts(workdir=str(tmp_path)))
        argv = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                "--monitor-interval", "0.1", str(script), str(saved), str(save)]
        out, err = Sink(), Sink()
        sup = Supervisor(argv, env=env, stdout_sink=out, stderr_sink=err, grace_seconds=0.5, shutdown_grace=grace)
        with sup:
            procs.add(sup.proc.pid)
            assert wait_until(lambda: b"ready" in out.data, 60), err.data[-2000:]
            timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
            timer.start()
            try:
                with pytest.raises(TorchrunInterrupted) as e:
                    sup.wait(interval=0.05)
            finally:
                timer.cancel()
            t0 = time.monotonic()
        took = time.monotonic() - t0
        assert sup.signalled == signal.SIGTERM and "shutdown_grace" in str(e.value)
        assert not is_running(sup.proc.pid)
        return saved.exists(), took

    @pytest.mark.timeout(90)
    def test_a_checkpoint_slower_than_a_failures_grace_is_saved(self, tmp_path, procs):
        saved, took = self._run(tmp_path, procs, grace=15, save=2)
        assert saved and took < 15

    @pytest.mark.timeout(90)
    def test_the_grace_is_a_bound(self, tmp_path, procs):
        saved, took = self._run(tmp_path, procs, grace=1, save=8)
        assert not saved and took < 8
