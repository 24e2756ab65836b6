"""host/private.py, basedir.py, logs.py, workdirs.py: every file @torchrun writes is private, never reached through a
symlink, and nothing is left behind (issue 13, item 5).

The attacks are run by a real second user where root can make one
(``tests/other_user.py``); otherwise those tests are skipped with the reason."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

import other_user
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import (KEEP_LOGS_ENV, KEEP_LOGS_HOURS_ENV, MAX_LOG_MB_ENV,
                                                                 Knobs, read_knobs)
from metaflow_extensions.torchrun.plugins.torchrun.host import logs, private
from metaflow_extensions.torchrun.plugins.torchrun.host.retention import RetentionPolicy
from metaflow_extensions.torchrun.plugins.torchrun.host.basedir import base_dir
from metaflow_extensions.torchrun.plugins.torchrun.host.logs import (
    LogKey,
    prune_logs,
    retention_policy,
    step_log_dir,
    where_logs_are,
)
from metaflow_extensions.torchrun.plugins.torchrun.host.private import UnsafePath, open_private, tail_lines
from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import CallFiles, prune_work_dirs

KEY = LogKey("Flow-1", "train-2-0", "c0")


# Beyond no age and no count (METAFLOW_TORCHRUN_KEEP_LOGS=0, ..._HOURS=0).
PRUNE_EVERYTHING = Knobs(keep_logs=0, keep_logs_hours=0)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(scope="module")
def other():
    try:
        yield other_user.make_user()
    finally:
        other_user.remove_user()


@pytest.fixture
def tmp(tmp_path):
    return other_user.sticky_tmp(str(tmp_path / "tmp")) if os.geteuid() == 0 else str(tmp_path)


def age(path, seconds):
    then = time.time() - seconds
    os.utime(path, (then, then))


# -- the base directory -------------------------------------------------------------


class TestBaseDir:
    def test_private_per_user_and_stable(self, tmp):
        base = base_dir(tmp)
        assert base == os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        assert mode(base) == 0o700 and os.lstat(base).st_uid == os.geteuid()
        assert base_dir(tmp) == base

    def test_loose_mode_of_our_own_directory_is_tightened(self, tmp):
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        os.mkdir(path)
        os.chmod(path, 0o777)
        assert base_dir(tmp) == path
        assert mode(path) == 0o700

    def test_symlink_at_the_path_is_replaced_and_its_target_untouched(self, tmp, tmp_path):
        target = tmp_path / "elsewhere"
        target.mkdir()
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        os.symlink(str(target), path)
        base = base_dir(tmp)
        assert base == path and not os.path.islink(path) and mode(path) == 0o700
        CallFiles(KEY, 0, base).close()
        assert os.listdir(str(target)) == []

    def test_a_file_at_the_path_gives_a_fresh_private_directory(self, tmp, capsys):
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        with open(path, "w") as f:
            f.write("not a directory")
        base = base_dir(tmp)
        assert base != path and os.path.dirname(base) == tmp and mode(base) == 0o700
        assert "not using it" in capsys.readouterr().err


class TestFallbackBound:
    """Issue 29: a squatted base made each node of each run fall back to a fresh
    temporary directory no cleanup visits (8 were left after 4 runs)."""

    def squat_and_run(self, tmp, tasks):
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("not a directory")  # as good as a stranger's for the fallback
        code = ("import sys; from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import CallFiles;"
                "from metaflow_extensions.torchrun.plugins.torchrun.host.logs import LogKey;"
                "from metaflow_extensions.torchrun.plugins.torchrun.host.basedir import base_dir;"
                "CallFiles(LogKey('Flow-1', 'train-2-0', 'c%s' % sys.argv[1]), 0, base_dir(sys.argv[2])).close()")
        for i in range(tasks):  # each task is a process of its own, as on a real run
            subprocess.run([sys.executable, "-c", code, str(i), tmp], check=True, capture_output=True, timeout=60)
        prefix = "metaflow-torchrun-%d-" % os.geteuid()
        return sorted(n for n in os.listdir(tmp) if n.startswith(prefix))

    def test_every_task_shares_one_fallback_directory(self, tmp):
        assert len(self.squat_and_run(tmp, 8)) == 1

    def test_extra_fallbacks_nobody_uses_go_and_strangers_are_never_used(self, tmp, tmp_path):
        prefix = "metaflow-torchrun-%d-" % os.geteuid()
        old = [os.path.join(tmp, prefix + s) for s in ("a", "b", "c")]
        for path in old:
            os.mkdir(path, 0o700)
        busy = os.path.join(old[2], "work", "1-x")
        os.makedirs(busy, 0o700)
        lock = private.hold_lock(busy)
        for path in old:
            age(path, 1000)
        target = tmp_path / "not-ours-to-use"
        target.mkdir()
        os.symlink(str(target), os.path.join(tmp, prefix + "0"))  # sorts first: skipped
        try:
            left = self.squat_and_run(tmp, 2)
        finally:
            private.release_lock(lock)
        assert left == [prefix + "0", prefix + "a", prefix + "c"]  # the link, the one used, the busy one
        assert os.listdir(str(target)) == []


class TestBaseDirAgainstAnotherUser:
    """Another user made our path first (issue 13: "another user who made the
    directory first ... got rank output")."""

    def test_directory_made_first_by_another_user_is_not_used(self, other, tmp, capsys):
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())

        def squat():
            os.mkdir(path)
            os.chmod(path, 0o777)
            os.mkdir(os.path.join(path, "logs"), 0o777)
            os.mkdir(os.path.join(path, "work"), 0o777)

        other_user.as_user(other, squat)
        files = CallFiles(KEY, 0, base_dir(tmp))
        try:
            assert not files.work_dir.startswith(path + os.sep)
            assert files.log_dir and not files.log_dir.startswith(path + os.sep)
            assert mode(files.base) == 0o700 and os.lstat(files.base).st_uid == os.geteuid()
        finally:
            files.close()
        assert os.listdir(os.path.join(path, "logs")) == []
        assert os.listdir(os.path.join(path, "work")) == []
        assert "owned by uid %d" % other[0] in capsys.readouterr().err

    def test_symlink_planted_by_another_user_is_not_followed(self, other, tmp, tmp_path):
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        trap = os.path.join(tmp, "trap")

        def plant():
            os.mkdir(trap, 0o777)
            os.symlink(trap, path)

        other_user.as_user(other, plant)
        files = CallFiles(KEY, 0, base_dir(tmp))
        try:
            assert os.path.realpath(files.work_dir).startswith(os.path.realpath(files.base))
            assert not os.path.realpath(files.work_dir).startswith(trap)
        finally:
            files.close()
        assert os.listdir(trap) == []

    def test_the_other_user_can_read_nothing_of_ours(self, other, tmp):
        files = CallFiles(KEY, 3, base_dir(tmp))
        try:
            log = os.path.join(files.log_dir, "rank-6.stdout.log")
            fd = open_private(log)
            os.write(fd, b"secret loss 0.1\n")
            os.close(fd)
            assert mode(log) == 0o600
            for d in (files.base, os.path.dirname(files.log_dir), files.log_dir, files.work_dir):
                assert mode(d) == 0o700, d

            def peek():
                found = {}
                for what in (files.base, files.log_dir, files.work_dir):
                    try:
                        os.listdir(what)
                        found[what] = "listed"
                    except PermissionError:
                        pass
                try:
                    with open(log) as f:
                        found[log] = f.read()
                except PermissionError:
                    pass
                try:
                    os.mkdir(os.path.join(files.log_dir, "x"))
                    found["mkdir"] = "made"
                except PermissionError:
                    pass
                return found

            assert other_user.as_user(other, peek) == {}
        finally:
            files.close()


TASK = (
    "import sys\n"
    "from metaflow_extensions.torchrun.plugins.torchrun.host.basedir import base_dir\n"
    "from metaflow_extensions.torchrun.plugins.torchrun.host.logs import LogKey\n"
    "from metaflow_extensions.torchrun.plugins.torchrun.host.private import open_private\n"
    "from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import CallFiles\n"
    "files = CallFiles(LogKey(sys.argv[2], 'train-2-0', 'c0'), 0, base_dir(sys.argv[1]))\n"
    "fd = open_private(files.log_dir + '/rank-0.stdout.log')\n"
    "import os; os.write(fd, b'loss ' + sys.argv[2].encode() + b'\\n'); os.close(fd)\n"
    "print(files.base, flush=True)\n"
    "if len(sys.argv) > 3: sys.stdin.readline()\n"
    "files.close()\n"
)


def run_task(tmp, run, hold=False):
    """One task of a run on this host, a process of its own: a call's files and
    one rank's log line. ``hold``: it stays (holding them) until told to end."""
    proc = subprocess.Popen([sys.executable, "-c", TASK, tmp, run] + (["hold"] if hold else []),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if hold:
        return proc, proc.stdout.readline().strip()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.strip()


def fallbacks(tmp):
    prefix = "metaflow-torchrun-%d-" % os.geteuid()
    return sorted(n for n in os.listdir(tmp) if n.startswith(prefix))


class TestFallbackAfterTheSquat:
    """Issue 38: once a squat ended, the fallback base and its runs' logs were
    kept for ever; retention ran only under the base a call used."""

    @pytest.fixture
    def squat(self, other, tmp):
        path = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        other_user.as_user(other, lambda: os.mkdir(path, 0o777))
        return path

    def test_the_next_call_brings_its_logs_home_and_no_fallback_is_left(self, other, squat, tmp):
        fallback = run_task(tmp, "Squatted-1")
        assert fallback != squat and fallbacks(tmp) == [os.path.basename(fallback)]
        age(os.path.join(fallback, "logs", "Squatted-1"), HOUR)
        used = os.lstat(os.path.join(fallback, "logs", "Squatted-1")).st_mtime_ns
        other_user.as_user(other, lambda: os.rmdir(squat))  # the squat ends
        assert run_task(tmp, "After-2") == squat
        assert fallbacks(tmp) == []
        log = os.path.join(squat, "logs", "Squatted-1", "train-2-0", "c0", "node-0", "rank-0.stdout.log")
        with open(log) as f:
            assert f.read() == "loss Squatted-1\n"  # kept, now under the retention of the usual base
        assert mode(os.path.dirname(log)) == 0o700
        assert os.lstat(os.path.join(squat, "logs", "Squatted-1")).st_mtime_ns == used  # its age kept

    def test_adopted_runs_are_pruned_by_the_usual_policy(self, squat, tmp, monkeypatch):
        run_task(tmp, "Squatted-1")
        os.rmdir(squat)
        monkeypatch.setattr(private, "YOUNG_SECONDS", 0.0)
        CallFiles(LogKey("After-2", "train-2-0", "c0"), 0, base_dir(tmp), knobs=PRUNE_EVERYTHING).close()
        assert fallbacks(tmp) == []
        assert run_names(os.path.join(squat, "logs")) == ["After-2"]

    def test_a_fallback_a_live_task_uses_is_kept_until_it_ends(self, squat, tmp):
        proc, fallback = run_task(tmp, "Squatted-1", hold=True)
        try:
            os.rmdir(squat)
            assert run_task(tmp, "After-2") == squat
            assert fallbacks(tmp) == [os.path.basename(fallback)]  # its task still runs there
        finally:
            proc.communicate("end\n", timeout=60)
        run_task(tmp, "After-3")
        assert fallbacks(tmp) == []
        assert "Squatted-1" in run_names(os.path.join(squat, "logs"))

    def test_a_strangers_directory_or_a_link_by_that_name_is_never_touched(self, other, tmp, tmp_path):
        prefix = os.path.join(tmp, "metaflow-torchrun-%d-" % os.geteuid())
        other_user.as_user(other, lambda: os.mkdir(prefix + "theirs", 0o700))
        target = tmp_path / "elsewhere"
        (target / "logs" / "Run-1").mkdir(parents=True)
        os.symlink(str(target), prefix + "link")
        run_task(tmp, "After-2")
        assert fallbacks(tmp) == ["metaflow-torchrun-%d-link" % os.geteuid(), "metaflow-torchrun-%d-theirs" % os.geteuid()]
        assert os.listdir(str(target / "logs")) == ["Run-1"]


# -- files ------------------------------------------------------------------------


class TestOpenPrivate:
    def test_new_file_is_0600_and_appends(self, tmp_path):
        path = str(tmp_path / "rank-0.stdout.log")
        for text in (b"a\n", b"b\n"):
            fd = open_private(path)
            os.write(fd, text)
            os.close(fd)
        assert mode(path) == 0o600
        assert open(path, "rb").read() == b"a\nb\n"

    def test_loose_file_of_ours_is_tightened(self, tmp_path):
        path = tmp_path / "log"
        path.write_text("x")
        path.chmod(0o644)
        os.close(open_private(str(path)))
        assert mode(path) == 0o600

    def test_symlink_to_a_root_only_file_is_refused_and_the_file_untouched(self, tmp_path):
        secret = tmp_path / "shadow"
        secret.write_text("root:secret\n")
        secret.chmod(0o600)
        link = tmp_path / "rank-0.stdout.log"
        link.symlink_to(secret)
        with pytest.raises(OSError):
            open_private(str(link))
        assert secret.read_text() == "root:secret\n"

    def test_fifo_is_refused_without_blocking(self, tmp_path):
        fifo = str(tmp_path / "fifo")
        os.mkfifo(fifo)
        with pytest.raises(UnsafePath):
            open_private(fifo, os.O_RDONLY)

    def test_file_of_another_user_is_refused(self, other, tmp):
        path = os.path.join(tmp, "theirs.log")
        other_user.as_user(other, lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)))
        with pytest.raises(UnsafePath):
            open_private(path)

    def test_relay_log_through_a_symlink_is_not_written(self, tmp_path):
        """The relay's per-rank log: a symlink swapped in is not followed."""
        from metaflow_extensions.torchrun.plugins.torchrun.procs import relay

        secret = tmp_path / "secret"
        secret.write_text("keep\n")
        logs = tmp_path / "logs"
        logs.mkdir()
        (logs / "rank-0.stdout.log").symlink_to(secret)
        code = (
            "import sys; from metaflow_extensions.torchrun.plugins.torchrun.procs import relay\n"
            "relay.start(0, True, sys.argv[1]); print('rank output')\n"
        )
        proc = subprocess.run([sys.executable, "-c", "import metaflow\n" + code, str(logs)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "[rank0]: rank output" in proc.stdout
        assert secret.read_text() == "keep\n"
        assert relay  # imported here too: the module loads without side effects


class TestTail:
    def test_last_lines(self, tmp_path):
        path = tmp_path / "log"
        path.write_text("".join("line %d\n" % i for i in range(100)))
        assert tail_lines(str(path), 3) == ["line 97", "line 98", "line 99"]

    def test_symlink_to_a_0600_file_is_not_read(self, tmp_path):
        secret = tmp_path / "secret"
        secret.write_text("password=hunter2\n")
        secret.chmod(0o600)
        link = tmp_path / "rank-0.stderr.log"
        link.symlink_to(secret)
        assert tail_lines(str(link), 20) == []

    def test_fifo_does_not_block(self, tmp_path):
        fifo = str(tmp_path / "fifo")
        os.mkfifo(fifo)
        assert tail_lines(fifo, 5) == []


# -- nothing left behind -------------------------------------------------------------


class TestCallFiles:
    def test_layout_and_close(self, tmp):
        base = base_dir(tmp)
        files = CallFiles(KEY, 1, base)
        assert os.path.dirname(files.work_dir) == os.path.join(base, "work")
        assert files.log_dir == os.path.join(base, "logs", "Flow-1", "train-2-0", "c0", "node-1")
        files.close()
        assert not os.path.exists(files.work_dir)
        assert os.path.isdir(files.log_dir)  # logs are kept
        files.close()  # twice is fine

    def test_a_base_found_at_the_steps_start_and_gone_since_is_found_again(self, tmp, monkeypatch):
        monkeypatch.setenv("TMPDIR", tmp)
        monkeypatch.setattr(tempfile, "tempdir", None)  # chosen from TMPDIR here, forgotten after
        step_base = base_dir()  # as GangSession.join finds it
        shutil.rmtree(step_base)  # a temporary-file cleaner, between the step's start and its call
        files = CallFiles(KEY, 0, step_base)
        try:
            assert files.base == base_dir() and os.path.isdir(files.work_dir)
            assert files.work_dir.startswith(files.base + os.sep) and mode(files.base) == 0o700
        finally:
            files.close()

    def test_work_dir_of_a_sigkilled_task_goes_with_the_next_call(self, tmp):
        base = base_dir(tmp)
        code = (
            "import sys, time\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import CallFiles\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.host.logs import LogKey\n"
            "f = CallFiles(LogKey('Flow-1', 'train-2-0', 'c0'), 0, sys.argv[1])\n"
            "print(f.work_dir, flush=True)\n"
            "time.sleep(60)\n"
        )
        proc = holder(code, base)
        try:
            left = proc.stdout.readline().strip()
            assert os.path.isdir(left)
            age(left, 1000)
            assert prune_work_dirs(os.path.join(base, "work")) == []  # alive: kept
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert os.path.isdir(left)
        files = CallFiles(LogKey("Flow-2", "train-2-0", "c0"), 0, base)
        try:
            assert not os.path.exists(left)
        finally:
            files.close()

    def test_a_young_directory_nobody_holds_yet_is_kept(self, tmp):
        root = os.path.join(base_dir(tmp), "work")
        os.makedirs(root, exist_ok=True)
        fresh = os.path.join(root, "123-abc")
        os.mkdir(fresh)
        assert prune_work_dirs(root) == []
        age(fresh, 1000)
        assert prune_work_dirs(root) == [fresh]

    def test_failing_to_make_the_logs_still_gives_a_work_dir(self, tmp, monkeypatch):
        base = base_dir(tmp)

        def full(*args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(logs, "prune_logs", full)
        files = CallFiles(KEY, 0, base)
        try:
            assert files.log_dir is None and os.path.isdir(files.work_dir)
        finally:
            files.close()


MB = 1024 * 1024
HOUR = 3600


def holder(code: str, arg: str) -> subprocess.Popen:
    """Another task on this host, as a child: it runs ``code`` (with
    ``sys.argv[1] == arg``), says a line on stdout and holds what it made
    until it ends or is killed."""
    return subprocess.Popen([sys.executable, "-c", "import metaflow\n" + code, arg],
                            stdout=subprocess.PIPE, text=True)


def make_run(root, name, size=0, seconds_ago=1000, calls=1):
    """A run's logs as @torchrun lays them out, last used ``seconds_ago``."""
    for c in range(calls):
        node = os.path.join(root, name, "train-2-0", "c%d" % c, "node-0")
        os.makedirs(node)
        with open(os.path.join(node, "rank-0.stdout.log"), "wb") as f:
            f.write(b"x" * size)
    age(os.path.join(root, name), seconds_ago)
    return os.path.join(root, name)


def run_names(root):
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


class TestLogRetention:
    """Issue 28, item 4: "a run's files were gone an hour later while other flows
    ran". The policy is tests/unit/test_retention.py's; here, real directories."""

    def test_a_run_within_the_age_survives_30_other_runs_on_the_host(self, tmp, monkeypatch):
        monkeypatch.setattr(private, "YOUNG_SECONDS", 0.0)
        base = base_dir(tmp)
        CallFiles(LogKey("A-1", "train-2-0", "c0"), 0, base).close()
        a = os.path.join(base, "logs", "A-1")
        age(a, HOUR)  # an hour later ...
        for i in range(30):  # ... while other flows ran
            CallFiles(LogKey("Other%d-%d" % (i, i), "train-2-0", "c0"), 0, base).close()
        assert os.path.isdir(os.path.join(a, "train-2-0", "c0", "node-0"))
        assert len(run_names(os.path.join(base, "logs"))) == 31
        age(a, 73 * HOUR)  # past the age, with 30 newer runs: the next call removes it
        CallFiles(LogKey("Next-1", "train-2-0", "c0"), 0, base).close()
        assert not os.path.exists(a)

    def test_a_call_that_prunes_later_prunes_only_when_told_and_once(self, tmp, monkeypatch):
        """A call makes its directories first and prunes once its agent has
        started (runtime/call.py): nothing goes before ``prune()``."""
        monkeypatch.setattr(private, "YOUNG_SECONDS", 0.0)
        base = base_dir(tmp)
        CallFiles(LogKey("Old-1", "train-2-0", "c0"), 0, base).close()
        old = os.path.join(base, "logs", "Old-1")
        age(old, HOUR)
        left = os.path.join(base, "work", "1-left")  # a killed task's work directory: nobody holds it
        os.makedirs(left)
        age(left, HOUR)
        files = CallFiles(LogKey("New-2", "train-2-0", "c0"), 0, base, prune_first=False, knobs=Knobs(keep_logs=1, keep_logs_hours=0))
        assert os.path.isdir(old) and os.path.isdir(left)
        files.prune()
        assert not os.path.exists(old) and not os.path.exists(left)
        assert files.log_dir is not None and os.path.isdir(files.log_dir)  # its own run is never pruned
        files.prune()  # once: a second call is a no-op
        files.close()

    def test_beyond_the_age_the_newest_runs_are_kept(self, tmp_path):
        root = str(tmp_path)
        runs = [make_run(root, "r%d" % i, seconds_ago=100 * HOUR + 10 * (9 - i)) for i in range(10)]
        removed = prune_logs(root, RetentionPolicy(keep=3, hours=72, max_bytes=1 << 30))
        assert sorted(removed) == sorted(runs[:7])
        assert run_names(root) == ["r7", "r8", "r9"]

    def test_a_run_goes_whole_every_step_and_call(self, tmp_path):
        root = str(tmp_path)
        make_run(root, "old", seconds_ago=100 * HOUR, calls=3)
        os.makedirs(os.path.join(root, "old", "other-5-1", "c0", "node-1"))
        age(os.path.join(root, "old"), 100 * HOUR)
        assert prune_logs(root, RetentionPolicy(keep=0, hours=72, max_bytes=1 << 30)) == [os.path.join(root, "old")]
        assert run_names(root) == []

    def test_the_age_counts_from_the_runs_last_call_on_the_host(self, tmp):
        base = base_dir(tmp)
        files = CallFiles(KEY, 0, base)
        run = os.path.join(base, "logs", KEY.run)
        age(run, 100 * HOUR)  # a call that ran for days ...
        files.close()  # ... ends now
        assert time.time() - os.lstat(run).st_mtime < 60
        assert prune_logs(os.path.join(base, "logs"), RetentionPolicy(keep=0, hours=72, max_bytes=1 << 30),
                          now=time.time() + 71 * HOUR) == []

    def test_for_space_the_least_recently_used_go_and_a_recent_one_is_said(self, tmp_path, capsys):
        root = str(tmp_path)
        for name, hours in (("r0", 3), ("r1", 2), ("r2", 1), ("old", 100)):
            make_run(root, name, size=1000, seconds_ago=hours * HOUR)
        prune_logs(root, RetentionPolicy(keep=10, hours=72, max_bytes=2500))
        assert run_names(root) == ["r1", "r2"]
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("@torchrun: the per-rank logs on this host passed METAFLOW_TORCHRUN_MAX_LOG_MB=")
        assert "removed those of 1 run used in the last 72 h" in err[0] and err[0].endswith(": r0")

    def test_nothing_is_said_when_only_old_runs_go(self, tmp_path, capsys):
        root = str(tmp_path)
        make_run(root, "old", size=1000, seconds_ago=100 * HOUR)
        make_run(root, "new", size=1000, seconds_ago=HOUR)
        prune_logs(root, RetentionPolicy(keep=10, hours=72, max_bytes=1500))
        assert run_names(root) == ["new"]
        assert capsys.readouterr().err == ""

    def test_a_run_in_use_or_just_made_is_kept(self, tmp_path):
        root = str(tmp_path)
        busy = make_run(root, "busy", size=10_000, seconds_ago=5000)
        lock = private.hold_lock(os.path.join(busy, "train-2-0", "c0", "node-0"))
        age(busy, 5000)
        make_run(root, "young", size=10_000, seconds_ago=0)
        make_run(root, "old", size=10_000, seconds_ago=4000)
        nothing = RetentionPolicy(keep=0, hours=0, max_bytes=0)
        try:
            prune_logs(root, nothing)
            assert run_names(root) == ["busy", "young"]
        finally:
            private.release_lock(lock)
        prune_logs(root, nothing)
        assert run_names(root) == ["young"]

    def test_a_run_a_live_task_holds_is_kept_even_for_space(self, tmp):
        base = base_dir(tmp)
        code = (
            "import sys, time\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import CallFiles\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.host.logs import LogKey\n"
            "f = CallFiles(LogKey('Live-1', 'train-2-0', 'c0'), 0, sys.argv[1])\n"
            "open(f.log_dir + '/rank-0.stdout.log', 'w').write('x' * 100000)\n"
            "print(f.log_dir, flush=True)\n"
            "time.sleep(60)\n"
        )
        proc = holder(code, base)
        root = os.path.join(base, "logs")
        run = os.path.join(root, "Live-1")
        try:
            assert proc.stdout.readline().strip().startswith(run)
            age(run, 100 * HOUR)
            assert prune_logs(root, RetentionPolicy(keep=0, hours=0, max_bytes=0)) == []
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert prune_logs(root, RetentionPolicy(keep=0, hours=0, max_bytes=0)) == [run]

    def test_an_old_layout_call_directory_is_a_run_to_the_policy(self, tmp_path):
        root = str(tmp_path)
        node = os.path.join(root, "Flow-1-train-2-0-c0", "node-0")
        os.makedirs(node)
        lock = private.hold_lock(node)
        age(os.path.dirname(node), 100 * HOUR)
        nothing = RetentionPolicy(keep=0, hours=0, max_bytes=0)
        try:
            assert prune_logs(root, nothing) == []
        finally:
            private.release_lock(lock)
        assert prune_logs(root, nothing) == [os.path.dirname(node)]

    def test_the_bound_holds_across_many_calls(self, tmp, monkeypatch):
        monkeypatch.setattr(private, "YOUNG_SECONDS", 0.0)
        base = base_dir(tmp)
        for i in range(30):
            CallFiles(LogKey("Flow-%d" % i, "train-2-0", "c0"), 0, base, knobs=Knobs(keep_logs=5, keep_logs_hours=0)).close()
        # The newest 5 kept by the bound, plus the one being made.
        assert len(run_names(os.path.join(base, "logs"))) <= 6
        assert os.listdir(os.path.join(base, "work")) == []

    def test_a_call_waits_for_another_tasks_prune_then_prunes(self, tmp, monkeypatch):
        """Calls make their directories under the host's prune lock: a prune
        never removes an old run between its choice and a new call of it."""
        base = base_dir(tmp)
        root = private.private_dir(os.path.join(base, "logs"))
        old = make_run(root, "Old-1", seconds_ago=100 * HOUR)
        code = (
            "import sys, time\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.host import logs, private\n"
            "fd = private.hold_lock(sys.argv[1], logs.PRUNE_LOCK_FILE)\n"
            "print('held', flush=True)\n"
            "time.sleep(1)\n"
        )
        proc = holder(code, root)
        try:
            assert proc.stdout.readline().strip() == "held"
            began = time.monotonic()
            log_dir = logs.call_log_dir(KEY, 0, base, knobs=PRUNE_EVERYTHING)
            waited = time.monotonic() - began
        finally:
            proc.wait(timeout=30)
        assert waited > 0.5 and log_dir is not None and os.path.isdir(log_dir)
        assert not os.path.exists(old)

    def test_a_prune_that_never_ends_costs_a_call_prune_wait_not_its_logs(self, tmp, monkeypatch):
        monkeypatch.setattr(logs, "PRUNE_WAIT", 0.2)
        base = base_dir(tmp)
        root = private.private_dir(os.path.join(base, "logs"))
        old = make_run(root, "Old-1", seconds_ago=100 * HOUR)
        guard = private.hold_lock(root, logs.PRUNE_LOCK_FILE)
        try:
            log_dir = logs.call_log_dir(KEY, 0, base, knobs=PRUNE_EVERYTHING)
        finally:
            private.release_lock(guard)
        assert log_dir is not None and os.path.isdir(log_dir)
        assert os.path.isdir(old)  # left for the next call


class TestPruneCost:
    """Pruning runs at every call's start on the host: it must not walk every
    file of every run each time (a busy host keeps thousands of runs within
    the age). A run is walked when it changed since it was measured."""

    def count_walks(self, monkeypatch):
        walked = []
        real = logs._size

        def counting(path):
            walked.append(os.path.basename(path))
            return real(path)

        monkeypatch.setattr(logs, "_size", counting)
        return walked

    def test_a_run_is_walked_once_until_it_changes(self, tmp_path, monkeypatch):
        root = str(tmp_path)
        for i in range(50):
            make_run(root, "r%02d" % i, size=10, seconds_ago=HOUR)
        loose = RetentionPolicy(keep=100, hours=72, max_bytes=1 << 30)
        walked = self.count_walks(monkeypatch)
        prune_logs(root, loose)
        assert len(walked) == 50
        assert mode(os.path.join(root, logs.LEDGER_FILE)) == 0o600
        del walked[:]
        prune_logs(root, loose)
        assert walked == []
        logs.touch(os.path.join(root, "r07"))  # a new call of that run
        prune_logs(root, loose)
        assert walked == ["r07"]

    def test_the_ledger_is_never_trusted_over_a_changed_directory(self, tmp_path):
        root = str(tmp_path)
        make_run(root, "small", size=10, seconds_ago=HOUR)
        make_run(root, "other", size=10, seconds_ago=2 * HOUR)
        st = os.lstat(os.path.join(root, "small"))
        with open(os.path.join(root, logs.LEDGER_FILE), "w") as f:  # a stale entry: another inode
            f.write("small\t%d\t%d\t%d\n" % (st.st_ino + 1, st.st_mtime_ns, 10**12))
        assert prune_logs(root, RetentionPolicy(keep=10, hours=72, max_bytes=100)) == []

    def test_a_symlinked_ledger_is_neither_read_nor_written_through(self, tmp_path):
        root = tmp_path / "logs"
        root.mkdir()
        target = tmp_path / "elsewhere"
        target.write_text("keep\n")
        os.symlink(str(target), str(root / logs.LEDGER_FILE))
        make_run(str(root), "r0", size=10, seconds_ago=HOUR)
        prune_logs(str(root), RetentionPolicy(keep=10, hours=72, max_bytes=1 << 30))
        assert target.read_text() == "keep\n"
        assert not os.path.islink(str(root / logs.LEDGER_FILE))

    def test_symlinks_and_files_in_the_logs_are_never_followed_counted_or_removed(self, tmp_path):
        root = tmp_path / "logs"
        root.mkdir()
        target = tmp_path / "target"
        target.mkdir()
        (target / "big").write_bytes(b"x" * 10_000)
        os.symlink(str(target), str(root / "Link-1"))
        (root / "File-1").write_text("x")
        make_run(str(root), "r0", size=10, seconds_ago=HOUR)
        assert prune_logs(str(root), RetentionPolicy(keep=0, hours=0, max_bytes=0)) == [str(root / "r0")]
        assert sorted(os.listdir(str(target))) == ["big"]
        assert os.path.islink(str(root / "Link-1")) and (root / "File-1").exists()


class TestKnobs:
    def test_the_defaults_and_the_settings(self):
        assert retention_policy() == RetentionPolicy(keep=20, hours=72.0, max_bytes=500 * MB)
        assert retention_policy(Knobs(keep_logs=3, keep_logs_hours=1.5, max_log_mb=7.5)) == RetentionPolicy(
            keep=3, hours=1.5, max_bytes=int(7.5 * MB))

    @pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "lots"])
    def test_a_value_that_is_not_a_finite_number_is_refused_at_the_start(self, value):
        """"inf" once failed every call with OverflowError: now the step's start refuses it."""
        names = (KEEP_LOGS_ENV, KEEP_LOGS_HOURS_ENV, MAX_LOG_MB_ENV)
        read, refused = read_knobs({name: value for name in names})
        assert retention_policy(read) == retention_policy() and len(refused) == 3, refused

    def test_the_line_that_says_where_the_files_are(self):
        log_dir = "/tmp/metaflow-torchrun-0/logs/Flow-1/train-2-0/c3/node-1"
        assert step_log_dir(log_dir) == "/tmp/metaflow-torchrun-0/logs/Flow-1/train-2-0"
        line = where_logs_are(log_dir, RetentionPolicy(keep=20, hours=72, max_bytes=500 * MB))
        assert line == ("this step's per-rank log files on this host (kept at least 72 h, less if all logs "
                        "here pass 500 MB): /tmp/metaflow-torchrun-0/logs/Flow-1/train-2-0")
        assert "newest 3 runs" in where_logs_are(log_dir, RetentionPolicy(keep=3, hours=0, max_bytes=MB))

    @pytest.mark.parametrize("part", ["..", ".", "", ".hidden", "a/b"])
    def test_a_log_key_is_plain_names_only(self, part):
        with pytest.raises(ValueError):
            LogKey("Flow-1", part, "c0")


class TestInsideTheBase:
    def test_symlinks_and_strangers_inside_our_base_are_moved_aside(self, tmp, tmp_path):
        """Left from a time the base was open to others: not followed, removed."""
        base = base_dir(tmp)
        target = tmp_path / "target"
        target.mkdir()
        os.symlink(str(target), os.path.join(base, "work"))
        with open(os.path.join(base, "logs"), "w") as f:
            f.write("a file where a directory goes")
        files = CallFiles(KEY, 0, base)
        try:
            assert mode(os.path.join(base, "work")) == 0o700
            assert files.log_dir is not None and mode(files.log_dir) == 0o700
        finally:
            files.close()
        assert os.listdir(str(target)) == []
        assert sorted(os.listdir(base)) == ["logs", "work"]
