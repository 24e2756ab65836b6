"""How a node's failure is reported: torch's typed failures as the agent records them, merged with the
ranks' records; the message of a node stopped by the gang; and the rendezvous
settings on the command line."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.launch import command, options
from metaflow_extensions.torchrun.plugins.torchrun import errors
from metaflow_extensions.torchrun.plugins.torchrun.gang import ports
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import (
    NO_EXCEPTION,
    RankFailure,
    crash_output,
    merge_failures,
    read_agent_failures,
    with_last_output,
)
from metaflow_extensions.torchrun.plugins.torchrun.procs import agent
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import AGENT_FAILURES_FILE, LOG_DIR_ENV, WORK_DIR_ENV

# -- torchrun's report: the agent's records of torch's typed failures ----------------


def process_failure(local_rank, pid, exitcode, timestamp, error_file="<N/A>"):
    """torch's own ProcessFailure, as its agent builds it for a failed worker."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=local_rank, pid=pid, exitcode=exitcode, error_file=error_file)
    if timestamp is not None:  # else torch's, read from the error file
        failure.timestamp = timestamp  # torch: when its agent noticed, to the second
    return failure


def child_failed(failures):
    pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    return ChildFailedError("/flow/train.py", failures)


# Three workers as torch's agent reports them: rank 5 segfaulted first, rank 6
# exited with 1, rank 7 was SIGKILLed.
def three_failures():
    return child_failed({
        6: process_failure(2, 4243, 1, 1709633709),
        7: process_failure(3, 4244, -9, 1709633710),
        5: process_failure(1, 4242, -11, 1709633708),
    })


def recorded(tmp_path, error, node_index=0):
    assert agent.record_child_failures(str(tmp_path), error)
    return read_agent_failures(str(tmp_path), node_index)


class TestAgentRecords:
    def test_every_failure_earliest_first(self, tmp_path):
        parsed = recorded(tmp_path, three_failures(), node_index=1)
        assert [f.rank for f in parsed] == [5, 6, 7]
        assert [f.local_rank for f in parsed] == [1, 2, 3]
        assert [f.pid for f in parsed] == [4242, 4243, 4244]
        assert [f.exc_type for f in parsed] == [
            "killed by signal SIGSEGV",
            "exit code 1",
            "killed by signal SIGKILL",
        ]
        assert [f.timestamp for f in parsed] == [1709633708.0, 1709633709.0, 1709633710.0]
        for f in parsed:
            assert isinstance(f, RankFailure)
            assert f.node_index == 1
            assert f.host == socket.gethostname()
            assert f.traceback == ""
        assert parsed[0].message == NO_EXCEPTION
        assert "SIGSEGV" in parsed[0].summary()

    def test_the_record_holds_torchs_fields(self, tmp_path):
        """Global and local rank, exit code and signal, pid, time, and the
        rank's torchelastic error file with what torch read from it."""
        error_file = tmp_path / "error.json"
        data = {"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback...",
                                                                         "timestamp": "1709633711"}}}
        error_file.write_text(json.dumps(data))
        error = child_failed({4: process_failure(0, 11, 1, None, error_file=str(error_file)),
                              5: process_failure(1, 12, -11, 1709633712)})
        assert agent.record_child_failures(str(tmp_path), error)
        path = tmp_path / AGENT_FAILURES_FILE
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
        by_rank = {r["rank"]: r for r in json.loads(path.read_text())}
        assert by_rank[4] == {"rank": 4, "local_rank": 0, "pid": 11, "exitcode": 1, "signal": None,
                              "timestamp": 1709633711.0, "host": socket.gethostname(),
                              "error_file": str(error_file), "error_file_data": data}
        assert (by_rank[5]["signal"], by_rank[5]["exitcode"], by_rank[5]["error_file"]) == ("SIGSEGV", -11, None)

    def test_nothing_recorded_reads_as_nothing(self, tmp_path):
        assert read_agent_failures(str(tmp_path), 0) == []
        assert read_agent_failures(str(tmp_path / "gone"), 0) == []

    @pytest.mark.parametrize(
        "garbage",
        [
            b"",
            b"\n\n\n",
            b"{}",
            b"[1, 2, null]",
            b'[{"rank": "5", "local_rank": 1, "pid": 3, "exitcode": 1, "timestamp": 1.0, "host": "h"}]',
            b'[{"rank": 5, "local_rank": 1, "pid": 3, "exitcode": true, "timestamp": 1.0, "host": "h"}]',
            b'[{"rank": 5, "local_rank": 1, "pid": 3, "exitcode": 1, "host": "h"}]',
            bytes(range(256)) * 4,
        ],
    )
    def test_garbage_gives_nothing(self, tmp_path, garbage):
        (tmp_path / AGENT_FAILURES_FILE).write_bytes(garbage)
        assert read_agent_failures(str(tmp_path), 0) == []

    def test_a_record_is_never_read_through_a_symlink(self, tmp_path):
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        assert agent.record_child_failures(str(elsewhere), three_failures())
        work = tmp_path / "work"
        work.mkdir()
        os.symlink(elsewhere / AGENT_FAILURES_FILE, work / AGENT_FAILURES_FILE)
        assert read_agent_failures(str(work), 0) == []

    def test_recording_never_raises(self, tmp_path):
        assert not agent.record_child_failures(None, three_failures())
        assert not agent.record_child_failures(str(tmp_path / "gone"), three_failures())
        assert not agent.record_child_failures(str(tmp_path), ValueError("no failures here"))


# The ranks of a real torchrun: local rank 1 segfaults; local rank 0 exits with 3
# (at once if torchrun's SIGTERM comes first, so that both ranks end as written).
CRASHING_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    local_rank = int(os.environ["LOCAL_RANK"])
    with open(os.path.join(sys.argv[1], "pid-%d" % local_rank), "w") as f:
        f.write(str(os.getpid()))
    if local_rank == 1:
        time.sleep(0.5)
        import ctypes
        ctypes.string_at(0)
    else:
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
        time.sleep(60)
        sys.exit(3)
    """
)


@pytest.fixture(scope="module")
def real_torchrun_report(tmp_path_factory):
    """Our agent (procs/agent.py: torch's own, recording what its
    ChildFailedError holds) running a real torchrun job that fails."""
    pytest.importorskip("torch.distributed.run")
    tmp = tmp_path_factory.mktemp("torchrun")
    work = tmp_path_factory.mktemp("work")
    script = tmp / "crash.py"
    script.write_text(CRASHING_SCRIPT)
    port = ports.find_free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", **{WORK_DIR_ENV: str(work)})
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    env.pop(LOG_DIR_ENV, None)
    started = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            command.AGENT_MODULE,
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:%d" % port,
            str(script),
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        timeout=120,
    )
    pids = {r: int((tmp / ("pid-%d" % r)).read_text()) for r in (0, 1)}
    return proc, pids, started, str(work)


class TestRealTorchrun:
    def test_segfault_and_exit_code(self, real_torchrun_report):
        proc, pids, started, work = real_torchrun_report
        assert proc.returncode == 1  # as torch's own torchrun ends
        assert b"ChildFailedError" in proc.stderr, proc.stderr[-3000:]  # torch's report, unchanged
        parsed = read_agent_failures(work, node_index=3)
        by_rank = {f.rank: f for f in parsed}
        assert sorted(by_rank) == [0, 1], proc.stderr[-3000:]
        assert "SIGSEGV" in by_rank[1].exc_type
        assert by_rank[1].exc_type == "killed by signal SIGSEGV"
        assert "exit code 3" in by_rank[0].exc_type
        assert by_rank[0].exc_type == "exit code 3"
        for rank, f in by_rank.items():
            assert f.local_rank == rank
            assert f.pid == pids[rank]
            assert f.node_index == 3
            assert f.host
            assert f.message == NO_EXCEPTION and f.traceback == ""
            # torch stamps a failure to the second.
            assert started - 2 <= f.timestamp <= time.time() + 1

    def test_a_ranks_own_record_replaces_torchruns_entry(self, real_torchrun_report):
        proc, pids, _, work = real_torchrun_report
        reported = read_agent_failures(work, node_index=0)
        own = RankFailure(
            rank=0, local_rank=0, node_index=0, host="h", pid=pids[0], exc_type="SystemExit",
            message="3", traceback="Traceback...\nSystemExit: 3\n", timestamp=time.time() - 10,
        )
        merged = merge_failures([own], reported)
        assert [f.rank for f in merged] == [0, 1]
        assert merged[0] is own
        assert merged[1].exc_type == "killed by signal SIGSEGV"


# -- merging -------------------------------------------------------------------


def failure(rank, timestamp, traceback="", exc_type="ValueError", node_index=0):
    return RankFailure(
        rank=rank, local_rank=rank % 2, node_index=node_index, host="h", pid=100 + rank,
        exc_type=exc_type, message="m%d" % rank, traceback=traceback, timestamp=timestamp,
    )


class TestMerge:
    def test_own_record_wins_others_added_sorted_by_time(self):
        own_3 = failure(3, 105.0, traceback="Traceback ...\nValueError: m3\n")
        own_1 = failure(1, 103.0, traceback="Traceback ...\nKeyError: k\n", exc_type="KeyError")
        from_torchrun = [
            failure(3, 100.0, exc_type="exit code 1"),  # earlier, but the rank's own record wins
            failure(0, 104.0, exc_type="killed by signal SIGSEGV"),
            failure(2, 101.0, exc_type="killed by signal SIGKILL"),
            failure(1, 106.0, exc_type="exit code 1"),
        ]
        recorded = [own_3, own_1]
        merged = merge_failures(recorded, from_torchrun)
        assert [(f.rank, f.timestamp) for f in merged] == [
            (2, 101.0), (1, 103.0), (0, 104.0), (3, 105.0)
        ]
        assert merged[1] is own_1 and merged[3] is own_3
        assert merged[3].traceback.startswith("Traceback")
        assert len({f.rank for f in merged}) == len(merged)
        # Inputs untouched.
        assert recorded == [own_3, own_1] and len(from_torchrun) == 4

    def test_either_side_empty(self):
        a = [failure(1, 2.0), failure(0, 1.0)]
        assert merge_failures([], a) == [a[1], a[0]]
        assert merge_failures(a, []) == [a[1], a[0]]
        assert merge_failures([], []) == []

    def test_the_root_cause_of_torchrun_failed_follows_the_merge(self, tmp_path):
        merged = merge_failures(
            [failure(1, 1709633720.0, traceback="Traceback\nValueError: m1\n")],
            recorded(tmp_path, three_failures()),
        )
        err = errors.TorchrunFailed(1, 0, merged)
        # rank 5's segfault (torchrun's report) came first; rank 1's own record is later.
        assert err.root_cause.rank == 5
        assert "killed by signal SIGSEGV" in str(err)
        # Two other failures of their own kind are named, the rest counted.
        assert "Also failed: rank 6 (node 0)" in str(err) and "Also failed: rank 7 (node 0)" in str(err)
        assert "Also failed: 1 more ranks (1)" in str(err)


# -- the message of a node stopped by the gang ------------------------------------


def crash_stderr(code: str) -> list:
    """A real crash's stderr: a Python process with faulthandler on, as every rank has."""
    proc = subprocess.run([sys.executable, "-c", "import faulthandler, sys\nfaulthandler.enable()\n" + code],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode < 0
    return proc.stderr.splitlines()


class TestLastOutput:
    """A rank killed by a signal records no traceback: its last stderr stands in."""

    def test_a_segfault_shows_where_python_was(self):
        lines = ["output %d" % i for i in range(100)] + crash_stderr(
            "import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()")
        shown = crash_output(lines)
        text = "\n".join(shown)
        assert "Fatal Python error: Segmentation fault" in text
        assert 'File "<string>", line 5 in crash' in text  # the innermost frame, with its line
        assert not any(line.startswith("Extension modules:") for line in shown)
        assert "output 95" in text and "output 94" not in text  # a few lines of context before

    def test_the_crashing_threads_stack_comes_before_the_other_threads(self):
        """Threads that wait where they always wait (a library's, a data loader's) are dumped first; the
        crashing one's stack is what the error shows."""
        waiters = "import threading\n" + "".join(
            "threading.Thread(target=threading.Event().wait, daemon=True).start()\n" for _ in range(3))
        lines = crash_stderr(waiters + "import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()")
        assert sum(line.startswith("Thread 0x") for line in lines) == 3  # faulthandler writes them first
        shown = crash_output(lines)
        headers = [i for i, line in enumerate(shown) if line.startswith(("Thread 0x", "Current thread"))]
        assert shown[headers[0]].startswith("Current thread") and len(headers) == 4, shown
        crashed = next(i for i, line in enumerate(shown) if '"<string>", line 9 in crash' in line)
        assert headers[0] < crashed < headers[1], shown

    def test_what_cpp_said_before_an_abort_is_kept(self):
        lines = crash_stderr("sys.stderr.write(\"terminate called after throwing an instance of "
                             "'c10::DistNetworkError'\\n\"); sys.stderr.flush()\nimport os\nos.abort()")
        text = "\n".join(crash_output(lines))
        assert "terminate called after throwing an instance of 'c10::DistNetworkError'" in text
        assert "Fatal Python error: Aborted" in text

    def test_without_a_python_dump_the_last_lines(self):
        lines = ["line %d" % i for i in range(50)]
        assert crash_output(lines) == lines[-20:]

    def test_a_long_dump_is_cut(self):
        lines = ["Fatal Python error: Segmentation fault"] + ["  File \"x.py\", line %d in f" % i for i in range(500)]
        assert len(crash_output(lines)) == 60

    def test_only_a_failure_without_a_traceback_gets_it(self):
        dead = failure(1, 1.0, exc_type="killed by signal SIGABRT")
        got = with_last_output(dead, ["Fatal Python error: Aborted"])
        assert got.traceback.endswith("Fatal Python error: Aborted") and got.rank == 1
        raised = failure(1, 1.0, traceback="Traceback ...\nValueError: boom")
        assert with_last_output(raised, ["whatever"]) is raised
        assert with_last_output(dead, []) is dead

    def test_the_error_shows_it(self):
        dead = with_last_output(failure(1, 1.0, exc_type="killed by signal SIGABRT"),
                                ["terminate called after throwing an instance of 'c10::Error'",
                                 "Fatal Python error: Aborted"])
        text = str(errors.TorchrunFailed(1, 0, [dead]))
        assert "killed by signal SIGABRT" in text and "terminate called after throwing" in text


class TestGangAborted:
    def test_stopped_because_another_node_failed(self):
        cause = Cause(CauseKind.RANK_FAILED, "node 0, rank 2: ValueError: boom", node_index=0,
                      traceback="Traceback (most recent call last):\n  in explode\nValueError: boom\n")
        e = errors.GangAborted(1, cause, own_exit_code=-15)
        text = str(e)
        assert text.startswith(
            "node 1 stopped because node 0 failed first: node 0, rank 2: ValueError: boom"
        )
        assert "in explode" in text  # a cluster: this node's log has no other copy of it
        assert e.node_index == 1
        assert e.cause is cause
        assert e.headline == "@torchrun gang stopped"
        assert isinstance(e, errors.TorchrunException)

    def test_a_step_failure_elsewhere_shows_its_traceback_cut_to_the_last_lines(self):
        tb = "\n".join("line %d" % i for i in range(100))
        cause = Cause(CauseKind.STEP_FAILED, "node 1 failed in its step before current.torch.run: "
                      "RuntimeError: x", node_index=1, traceback=tb)
        text = str(errors.GangAborted(0, cause))
        assert "node 0 stopped because node 1 failed first: node 1 failed in its step" in text
        assert "line 99" in text and "line 88" not in text and "89 lines above are in the rank's log" in text

    @pytest.mark.parametrize(
        "kind, origin",
        [(CauseKind.NODE_LOST, 2), (CauseKind.UNRESPONSIVE, 0), (CauseKind.NEVER_JOINED, None),
         (CauseKind.CONTROL_LOST, 0), (CauseKind.CONTROL_UNRESPONSIVE, 0),
         (CauseKind.CONTROL_UNREACHABLE, None), (CauseKind.LEFT_EARLY, 1), (CauseKind.CALL_MISMATCH, 1)],
    )
    def test_other_causes(self, kind, origin):
        cause = Cause(kind, "the summary of %s" % kind.value, node_index=origin)
        text = str(errors.GangAborted(1 if origin != 1 else 2, cause))
        assert text.endswith("stopped: the summary of %s" % kind.value)
        assert "failed first" not in text and "traceback" not in text

    def test_own_failure_is_not_blamed_on_itself(self):
        text = str(errors.GangAborted(1, Cause(CauseKind.RANK_FAILED, "S", node_index=1)))
        assert text == "node 1 stopped: S"

    def test_failed_at_node_0_is_named_from_node_2(self):
        # node_index 0 is falsy; it must still be named.
        text = str(errors.GangAborted(2, Cause(CauseKind.RANK_FAILED, "S", node_index=0)))
        assert text.startswith("node 2 stopped because node 0 failed first: S")


# -- rendezvous settings ---------------------------------------------------------


def launch(node_index, user_options, restarts=True):
    """With restarts, torch's c10d rendezvous, whose store node 0 hosts (is_host);
    without, the static one (TestStaticRdzvConf)."""
    if restarts:
        user_options = dict(user_options, **{"max-restarts": "1"})
    return command.Launch(
        python="/usr/bin/python3",
        num_nodes=2,
        node_index=node_index,
        nproc_per_node=4,
        rdzv_host="10.0.0.1",
        rdzv_port=29500,
        rdzv_id="flow-1-train-2-0",
        entrypoint="/flow/train.py",
        user_options=user_options,
    )


def rdzv_conf(argv):
    assert argv.count("--rdzv-conf") == 1, argv
    return argv[argv.index("--rdzv-conf") + 1]


def torch_reads(argv):
    """The rendezvous settings torchrun itself would use for this argv."""
    run = pytest.importorskip("torch.distributed.run")
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    args = run.get_args_parser().parse_args(argv[3:])
    return _parse_rendezvous_config(args.rdzv_conf)


class TestRdzvConf:
    def test_default_says_which_node_hosts_the_store(self):
        assert rdzv_conf(command.build_command(launch(0, {}))) == "is_host=1,join_timeout=1200"
        assert rdzv_conf(command.build_command(launch(1, {}))) == "is_host=0,join_timeout=1200"

    def test_torch_waits_longer_than_the_gang_for_a_late_node(self):
        """A node launches when it reaches the call, before the others: the
        gang's start_timeout names a node that never arrives, so torch's own
        rendezvous must not give up first."""
        for start_timeout, expected in [(600.0, 1200), (30.5, 631), (3600, 4200)]:
            argv = command.build_command(dataclasses.replace(launch(1, {}), start_timeout=start_timeout))
            assert torch_reads(argv) == {"is_host": "0", "join_timeout": str(expected)}
            assert int(torch_reads(argv)["join_timeout"]) >= start_timeout + command.TORCH_JOIN_TIMEOUT

    @pytest.mark.parametrize("node_index, is_host", [(0, "1"), (1, "0")])
    def test_users_settings_are_added_to_is_host(self, node_index, is_host):
        argv = command.build_command(launch(node_index, {"rdzv-conf": "join_timeout=900"}))
        conf = rdzv_conf(argv)
        assert conf.split(",") == ["is_host=%s" % is_host, "join_timeout=900"]
        assert torch_reads(argv) == {"is_host": is_host, "join_timeout": "900"}
        # The rest of the command is as without the user's setting.
        base = command.build_command(launch(node_index, {}))
        i = argv.index("--rdzv-conf") + 1
        assert argv[:i] + argv[i + 1:] == base[:i] + base[i + 1:]

    @pytest.mark.parametrize("node_index", [0, 1])
    def test_users_is_host_is_used_unchanged(self, node_index):
        mine = "join_timeout=900,is_host=0"
        argv = command.build_command(launch(node_index, {"rdzv-conf": mine}))
        assert sorted(rdzv_conf(argv).split(",")) == sorted(mine.split(","))
        assert torch_reads(argv) == {"is_host": "0", "join_timeout": "900"}

    def test_a_malformed_setting_reaches_torch_as_written(self):
        argv = command.build_command(launch(0, {"rdzv-conf": "read_timeout=60,oops"}))
        assert rdzv_conf(argv) == "is_host=1,join_timeout=1200,read_timeout=60,oops"
        with pytest.raises(ValueError, match="rendezvous configuration"):
            torch_reads(argv)

    @pytest.mark.parametrize(
        "torchrun_args",
        [
            {"rdzv_conf": "join_timeout=900,read_timeout=60"},
            {"--rdzv-conf": "join_timeout=900,read_timeout=60"},
            ["--rdzv_conf", "join_timeout=900,read_timeout=60"],
            ["--rdzv-conf=join_timeout=900,read_timeout=60"],
        ],
    )
    def test_every_spelling_of_the_option_merges(self, torchrun_args):
        argv = command.build_command(launch(1, options.parse_options(torchrun_args)))
        assert rdzv_conf(argv).split(",") == ["is_host=0", "join_timeout=900", "read_timeout=60"]
        assert torch_reads(argv)["is_host"] == "0"

    def test_user_options_are_not_mutated(self):
        user = {"rdzv-conf": "join_timeout=900"}
        command.build_command(launch(0, user, restarts=False))
        assert user == {"rdzv-conf": "join_timeout=900"}


class TestStaticRdzvConf:
    """Without restarts: torch's static rendezvous, whose one wait is ``timeout``."""

    @pytest.mark.parametrize("node_index", [0, 1, 5])
    def test_node_rank_is_the_node_index_and_timeout_the_join_timeout(self, node_index):
        argv = command.build_command(launch(node_index, {}, restarts=False))
        run = pytest.importorskip("torch.distributed.run")
        args = run.get_args_parser().parse_args(argv[3:])
        assert (args.rdzv_backend, args.node_rank) == ("static", node_index)
        assert torch_reads(argv) == {"timeout": "1200"}

    def test_users_join_timeout_is_the_static_timeout(self):
        argv = command.build_command(launch(1, {"rdzv-conf": "join_timeout=900"}, restarts=False))
        assert torch_reads(argv) == {"timeout": "900", "join_timeout": "900"}

    def test_users_own_timeout_wins(self):
        argv = command.build_command(launch(1, {"rdzv-conf": "join_timeout=900,timeout=30"}, restarts=False))
        assert torch_reads(argv) == {"timeout": "30", "join_timeout": "900"}


# -- root cause over echoes ----------------------------------------------------

GLOO_PEER_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:10126. This is typically caused by a remote worker crashing. Check the "
    "logs of the remote worker before reporting an error."
)


def said(exc_type, message):
    return RankFailure(rank=0, local_rank=0, node_index=0, host="h", pid=1, exc_type=exc_type,
                       message=message, traceback="", timestamp=1.0)


class TestRootCauseOrder:
    def test_a_segfault_stamped_later_still_beats_the_connection_errors_it_caused(self):
        # torchrun stamps a signal death to the second, when its agent noticed it:
        # the peer's connection error can carry an earlier time.
        echo = failure(0, 100.95, exc_type="RuntimeError")
        echo = RankFailure(**{**echo.__dict__, "message": GLOO_PEER_GONE})
        segv = failure(1, 101.0, exc_type="killed by signal SIGSEGV")
        merged = merge_failures([echo], [segv])
        assert [f.rank for f in merged] == [1, 0]
        assert errors.TorchrunFailed(1, 0, [echo, segv]).root_cause is segv

    @pytest.mark.parametrize(
        "exc_type, message",
        [
            ("RuntimeError", GLOO_PEER_GONE),
            ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"),
            ("DistBackendError", "NCCL error: remote process exited or there was a network error"),
            ("DistBackendError", "NCCL communicator was aborted on rank 3."),
            ("DistNetworkError", "failed to recv, got 0 bytes"),
            ("killed by signal SIGTERM", NO_EXCEPTION),
        ],
    )
    def test_echoes_of_a_peer_are_secondary(self, exc_type, message):
        assert said(exc_type, message).secondary

    @pytest.mark.parametrize(
        "exc_type, message",
        [
            ("ValueError", "boom"),
            ("killed by signal SIGSEGV", NO_EXCEPTION),
            ("killed by signal SIGKILL", NO_EXCEPTION),
            ("exit code 1", NO_EXCEPTION),
            ("OutOfMemoryError", "CUDA out of memory"),
        ],
    )
    def test_failures_of_their_own_are_primary(self, exc_type, message):
        assert not said(exc_type, message).secondary

    def test_when_all_are_echoes_the_earliest_is_first(self):
        a = RankFailure(**{**failure(0, 5.0).__dict__, "message": GLOO_PEER_GONE})
        b = RankFailure(**{**failure(1, 3.0).__dict__, "message": "Connection reset by peer"})
        assert [f.rank for f in merge_failures([a, b], [])] == [1, 0]

    def test_a_real_gloo_peer_loss_is_recognised(self, tmp_path):
        """What torch itself raises in a rank whose gloo peer segfaulted."""
        pytest.importorskip("torch.distributed")
        script = tmp_path / "peer.py"
        script.write_text(textwrap.dedent(
            """
            import ctypes, os, signal, sys, time, torch, torch.distributed as dist
            # torchrun stops the surviving rank once the other dies: let it
            # record what gloo said first.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            dist.init_process_group("gloo")
            if dist.get_rank() == 1:
                dist.barrier()
                ctypes.string_at(0)
            # Rank 0 may still be in the barrier when rank 1 has left it and
            # died: what gloo says there counts too.
            try:
                dist.barrier()
                while True:
                    dist.all_reduce(torch.zeros(1))
                    time.sleep(0.02)
            except Exception as e:
                with open(sys.argv[1], "w") as f:
                    f.write(type(e).__name__ + "\\n" + str(e))
                os._exit(1)
            """
        ))
        out = tmp_path / "error.txt"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:%d" % ports.find_free_port(),
             str(script), str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=120,
        )
        exc_type, message = out.read_text().split("\n", 1)
        assert said(exc_type, message).secondary, (exc_type, message)
