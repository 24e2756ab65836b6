"""failures.py and errors.py: how rank failures are recorded and reported."""

from __future__ import annotations

import json
import os
import signal

import pytest
from metaflow.exception import MetaflowException

from metaflow_extensions.torchrun.plugins.torchrun.errors import (
    TorchrunException,
    TorchrunFailed,
    TorchrunInterrupted,
    TorchrunInvalidArgument,
)
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import FAILURE_SUFFIX as RANK_FAILURE_SUFFIX
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import RANK_PREFIX as RANK_FAILURE_PREFIX
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import (
    RankFailure,
    describe_exit_code,
    failure_path,
    read_failures,
    write_failure,
)


def failure(rank=0, timestamp=100.0, **over):
    fields = dict(
        rank=rank,
        local_rank=rank % 4,
        node_index=rank // 4,
        host="host-%d" % (rank // 4),
        pid=1000 + rank,
        exc_type="ValueError",
        message="boom %d" % rank,
        traceback='Traceback (most recent call last):\n  File "/w/train.py", line 3, in <module>\n'
        "    raise ValueError('boom %d')\nValueError: boom %d\n" % (rank, rank),
        timestamp=timestamp,
    )
    fields.update(over)
    return RankFailure(**fields)


class TestDescribeExitCode:
    @pytest.mark.parametrize(
        "code, text",
        [
            (-11, "killed by signal SIGSEGV"),
            (-9, "killed by signal SIGKILL"),
            (-15, "killed by signal SIGTERM"),
            (-6, "killed by signal SIGABRT"),
            (1, "exit code 1"),
            (0, "exit code 0"),
            (2, "exit code 2"),
            (128, "exit code 128"),
            (137, "exit code 137 (SIGKILL)"),
            (139, "exit code 139 (SIGSEGV)"),
            (143, "exit code 143 (SIGTERM)"),
        ],
    )
    def test_names(self, code, text):
        assert describe_exit_code(code) == text

    def test_signal_names(self):
        assert "SIGSEGV" in describe_exit_code(-11)
        assert "SIGKILL" in describe_exit_code(137)
        assert describe_exit_code(1) == "exit code 1"

    def test_unknown_signal_numbers(self):
        assert describe_exit_code(-200) == "killed by signal 200"
        # 255 - 128 = 127 is no signal: plain exit code
        assert describe_exit_code(255) == "exit code 255"


class TestFailureFiles:
    def test_round_trip(self, tmp_path):
        f = failure(rank=5, message="ünïcödé\nsecond line", traceback="tb 'quoted' \"x\"")
        write_failure(str(tmp_path), f)
        assert read_failures(str(tmp_path)) == [f]

    def test_one_file_per_rank_named_for_it(self, tmp_path):
        write_failure(str(tmp_path), failure(rank=3))
        write_failure(str(tmp_path), failure(rank=12))
        assert sorted(os.listdir(tmp_path)) == sorted(
            [os.path.basename(failure_path(str(tmp_path), r)) for r in (3, 12)]
        )
        assert failure_path("/d", 7) == "/d/%s7%s" % (RANK_FAILURE_PREFIX, RANK_FAILURE_SUFFIX)

    def test_no_temporary_file_left(self, tmp_path):
        write_failure(str(tmp_path), failure(rank=1))
        assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []

    def test_sorted_by_timestamp_not_rank_or_name(self, tmp_path):
        records = [
            failure(rank=0, timestamp=300.0),
            failure(rank=10, timestamp=100.0),
            failure(rank=2, timestamp=200.0),
            failure(rank=1, timestamp=250.0),
        ]
        for r in records:
            write_failure(str(tmp_path), r)
        assert [f.rank for f in read_failures(str(tmp_path))] == [10, 2, 1, 0]

    def test_rewrite_replaces(self, tmp_path):
        write_failure(str(tmp_path), failure(rank=1, message="first"))
        write_failure(str(tmp_path), failure(rank=1, message="second"))
        out = read_failures(str(tmp_path))
        assert [f.message for f in out] == ["second"]

    def test_junk_is_ignored(self, tmp_path):
        good = failure(rank=4)
        write_failure(str(tmp_path), good)
        d = tmp_path
        (d / "notes.txt").write_text("hello")
        (d / "rank-1.json").write_text(json.dumps({"rank": 1}))  # wrong suffix
        (d / "other-2.failure.json").write_text("{}")  # wrong prefix
        (d / "rank-5.failure.json").write_text("{not json")
        (d / "rank-6.failure.json").write_text("")
        (d / "rank-7.failure.json").write_text(json.dumps({"rank": 7}))  # missing fields
        extra = dict(good.__dict__, rank=8, unexpected="x")
        (d / "rank-8.failure.json").write_text(json.dumps(extra))  # unknown field
        (d / "rank-9.failure.json").write_text("[1, 2]")
        (d / "rank-10.failure.json").write_text("null")
        (d / "rank-11.failure.json").mkdir()  # a directory with the right name
        (d / "rank-12.failure.json.999.tmp").write_text(json.dumps(good.__dict__))
        (d / "rank-13.failure.json").write_bytes(b"\xff\xfe\x00junk")
        assert read_failures(str(d)) == [good]

    def test_missing_directory(self, tmp_path):
        assert read_failures(str(tmp_path / "nope")) == []

    def test_empty_directory(self, tmp_path):
        assert read_failures(str(tmp_path)) == []

    def test_summary(self):
        s = failure(rank=6, pid=4321, host="gpu-7", exc_type="KeyError", message="'x'").summary()
        assert s == "node 1, rank 6 (local rank 2, pid 4321 on gpu-7): KeyError: 'x'"


class TestTorchrunFailed:
    def test_names_node_rank_type_and_traceback(self):
        f = failure(rank=6, exc_type="ZeroDivisionError", message="division by zero",
                    traceback="Traceback (most recent call last):\n  File \"/w/train.py\", "
                    "line 9, in step\nZeroDivisionError: division by zero\n")
        e = TorchrunFailed(1, 1, [f], ["python", "-m", "torch.distributed.run"])
        msg = str(e)
        assert "node 1" in msg
        assert "rank 6" in msg
        assert "ZeroDivisionError" in msg
        assert "division by zero" in msg
        assert 'File "/w/train.py", line 9, in step' in msg
        assert "raise" not in msg.splitlines()[0]  # the head names who failed; the traceback what
        assert e.exit_code == 1 and e.node_index == 1
        assert e.root_cause == f
        assert e.command == ["python", "-m", "torch.distributed.run"]

    def test_root_cause_is_the_earliest_and_others_are_listed(self):
        late = failure(rank=5, timestamp=200.0, exc_type="RuntimeError", message="NCCL timeout")
        early = failure(rank=2, timestamp=100.0, exc_type="ValueError", message="bad batch")
        e = TorchrunFailed(1, 0, [late, early])
        assert e.root_cause == early
        assert e.failures == [early, late]
        msg = str(e)
        first = msg.index("First failure")
        assert "rank 2" in msg[first:].splitlines()[0] and "Traceback" in msg  # rank 2's own
        assert "Also failed: rank 5" in msg
        # the root cause is reported before the others
        assert msg.index("rank 2") < msg.index("Also failed")

    def test_no_failures(self):
        for failures in (None, []):
            e = TorchrunFailed(-9, 2, failures)
            msg = str(e)
            assert "no rank recorded" in msg
            assert "node 2" in msg
            assert "killed by signal SIGKILL" in msg
            assert e.root_cause is None and e.failures == []
            assert "First failure" not in msg

    def test_empty_traceback_is_omitted(self):
        e = TorchrunFailed(3, 0, [failure(rank=0, exc_type="SystemExit", message="3", traceback="")])
        lines = str(e).splitlines()
        assert lines[0].startswith("First failure") and "SystemExit: 3" in lines[0] and len(lines) == 1

    def test_single_failure_has_no_also_line(self):
        assert "Also failed" not in str(TorchrunFailed(1, 0, [failure()]))

    def test_is_a_metaflow_exception_with_headline(self):
        e = TorchrunFailed(1, 0, [])
        assert isinstance(e, TorchrunException) and isinstance(e, MetaflowException)
        assert e.headline == "@torchrun job failed"
        assert e.message == str(e)

    def test_other_error_types(self):
        assert issubclass(TorchrunInvalidArgument, TorchrunException)
        assert issubclass(TorchrunInterrupted, TorchrunException)
        assert str(TorchrunInvalidArgument("bad thing")) == "bad thing"
        assert TorchrunInvalidArgument.headline != TorchrunFailed.headline


def test_signal_numbers_match_platform():
    # describe_exit_code relies on the platform's numbering.
    assert describe_exit_code(-int(signal.SIGINT)) == "killed by signal SIGINT"
