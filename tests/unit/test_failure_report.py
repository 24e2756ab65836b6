"""How a node's failure is reported: torchrun's own summary, merged with the
ranks' records; the message of a node stopped by the gang; and the rendezvous
settings on the command line."""

from __future__ import annotations

import dataclasses
import os
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
    parse_torchrun_summary,
    with_last_output,
)

# -- torchrun's report ---------------------------------------------------------

# Written the way torch 2.x prints a ChildFailedError (note the trailing spaces
# after "(pid: N)" and the "(SIGSEGV)" after a signal), around other log noise.
HAND_WRITTEN = b"""\
[rank1]: some output from the user's script
W1122 02:48:49.128000 13042 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 4243 closing signal SIGTERM
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
/flow/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-03-05_10:15:09
  host      : ip-10-0-1-7.ec2.internal
  rank      : 6 (local_rank: 2)
  exitcode  : 1 (pid: 4243)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/2/error.json
  traceback : Traceback (most recent call last):
    File "/flow/train.py", line 9, in <module>
      raise ValueError("boom")
  ValueError: boom
[2]:
  time      : 2024-03-05_10:15:10
  host      : ip-10-0-1-7.ec2.internal
  rank      : 7 (local_rank: 3)
  exitcode  : -9 (pid: 4244)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4244
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-03-05_10:15:08
  host      : ip-10-0-1-7.ec2.internal
  rank      : 5 (local_rank: 1)
  exitcode  : -11 (pid: 4242)  (SIGSEGV)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 4242
============================================================
"""


def stamp(text):
    return time.mktime(time.strptime(text, "%Y-%m-%d_%H:%M:%S"))


class TestParseHandWritten:
    def test_every_entry_earliest_first(self):
        parsed = parse_torchrun_summary(HAND_WRITTEN, node_index=1)
        assert [f.rank for f in parsed] == [5, 6, 7]
        assert [f.local_rank for f in parsed] == [1, 2, 3]
        assert [f.pid for f in parsed] == [4242, 4243, 4244]
        assert [f.exc_type for f in parsed] == [
            "killed by signal SIGSEGV",
            "exit code 1",
            "killed by signal SIGKILL",
        ]
        assert [f.timestamp for f in parsed] == [
            stamp("2024-03-05_10:15:08"),
            stamp("2024-03-05_10:15:09"),
            stamp("2024-03-05_10:15:10"),
        ]
        for f in parsed:
            assert isinstance(f, RankFailure)
            assert f.node_index == 1
            assert f.host == "ip-10-0-1-7.ec2.internal"
            assert f.traceback == ""
        assert parsed[0].message == NO_EXCEPTION
        assert "SIGSEGV" in parsed[0].summary()

    def test_crlf_line_endings(self):
        parsed = parse_torchrun_summary(HAND_WRITTEN.replace(b"\n", b"\r\n"), node_index=0)
        assert [f.rank for f in parsed] == [5, 6, 7]
        assert parsed[0].host == "ip-10-0-1-7.ec2.internal"

    def test_a_tail_that_cut_the_report_keeps_the_whole_entries(self):
        cut = HAND_WRITTEN[HAND_WRITTEN.index(b"  host      : ip-10-0-1-7.ec2.internal\n  rank      : 6"):]
        parsed = parse_torchrun_summary(cut, node_index=0)
        assert [f.rank for f in parsed] == [5, 7]

    def test_an_unreadable_time_still_gives_the_entry(self):
        text = HAND_WRITTEN.replace(b"2024-03-05_10:15:08", b"<N/A>")
        before = time.time()
        parsed = {f.rank: f for f in parsed_list(text)}
        assert before - 1 <= parsed[5].timestamp <= time.time() + 1
        assert parsed[6].timestamp == stamp("2024-03-05_10:15:09")

    @pytest.mark.parametrize(
        "garbage",
        [
            b"",
            b"\n\n\n",
            b"Traceback (most recent call last):\nValueError: nothing to see\n",
            bytes(range(256)) * 4,
            b"  time      : 2024-03-05_10:15:08\n  host      : h\n  rank      : x (local_rank: 1)\n"
            b"  exitcode  : 1 (pid: 3)\n",
            b"  time      : 2024-03-05_10:15:08\n  host      : h\n  rank      : 1 (local_rank: 1)\n",
            "time : 2024 \u00e9\u00e8 rank exitcode".encode("utf-8"),
        ],
    )
    def test_garbage_gives_nothing(self, garbage):
        assert parse_torchrun_summary(garbage, node_index=0) == []

    def test_non_utf8_host_does_not_break_parsing(self):
        text = HAND_WRITTEN.replace(b"ip-10-0-1-7.ec2.internal", b"h\xff\xfeost")
        parsed = parse_torchrun_summary(text, node_index=0)
        assert [f.rank for f in parsed] == [5, 6, 7]
        assert parsed[0].host.startswith("h") and parsed[0].host.endswith("ost")


def parsed_list(text):
    return parse_torchrun_summary(text, node_index=0)


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
    pytest.importorskip("torch.distributed.run")
    tmp = tmp_path_factory.mktemp("torchrun")
    script = tmp / "crash.py"
    script.write_text(CRASHING_SCRIPT)
    port = ports.find_free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    started = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
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
    return proc, pids, started


class TestParseRealTorchrun:
    def test_segfault_and_exit_code(self, real_torchrun_report):
        proc, pids, started = real_torchrun_report
        assert proc.returncode != 0
        assert b"ChildFailedError" in proc.stderr, proc.stderr[-3000:]
        parsed = parse_torchrun_summary(proc.stderr, node_index=3)
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
            # torchrun prints local time to the second.
            assert started - 2 <= f.timestamp <= time.time() + 1

    def test_a_ranks_own_record_replaces_torchruns_entry(self, real_torchrun_report):
        proc, pids, _ = real_torchrun_report
        reported = parse_torchrun_summary(proc.stderr, node_index=0)
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

    def test_the_root_cause_of_torchrun_failed_follows_the_merge(self):
        merged = merge_failures(
            [failure(1, stamp("2024-03-05_10:15:20"), traceback="Traceback\nValueError: m1\n")],
            parse_torchrun_summary(HAND_WRITTEN, node_index=0),
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
            dist.barrier()
            if dist.get_rank() == 1:
                time.sleep(0.3)
                ctypes.string_at(0)
            try:
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
