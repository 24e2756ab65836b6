"""The evidence bundle of a failed attempt (record/evidence.py): bounded at
1,024 nodes, stacks grouped, Flight Recorder dumps found by torch's prefix."""

import json

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import NodeReport
from metaflow_extensions.torchrun.plugins.torchrun.procs import names
from metaflow_extensions.torchrun.plugins.torchrun.record import evidence
from metaflow_extensions.torchrun.plugins.torchrun.record.gang_view import GangView
from metaflow_extensions.torchrun.plugins.torchrun.record.result import TorchrunResult

STACK = 'Current thread 0x1 (most recent call first):\n  File "/w/train.py", line %d in step\n'


def _result(nodes, per_node=8, cause=None):
    reports = {n: NodeReport(tails={n * per_node + r: {"stderr": ["x" * 400] * 50} for r in range(per_node)})
               for n in range(nodes)}
    stacks = {r: STACK % (10 if r % 97 else 20) * 40 for r in range(nodes * per_node)}
    return TorchrunResult(command=[], node_index=0, num_nodes=nodes, nproc_per_node=per_node, exit_code=1,
                          started_at=0.0, ended_at=1.0, gang=GangView(reports=reports), stacks=stacks,
                          cause=cause or Cause(CauseKind.NODE_LOST, "node 5 lost", node_index=5))


def test_the_bundle_stays_bounded_at_1024_nodes(tmp_path):
    bundle = evidence.bundle(_result(1024), True, 0, 2, {names.FR_DUMP_ENV: str(tmp_path / "none_")})
    size = len(json.dumps(bundle))
    assert size <= evidence.MAX_BYTES, size
    assert bundle["attempt"] == 2 and bundle["cause"]["node_index"] == 5
    assert [s["count"] for s in bundle["stacks"]] == [85, 8192 - 85]  # the odd ones out first
    assert bundle["tails"]["left_out"] > 0 and len(bundle["tails"]["ranks"]["0"]["stderr"]) == evidence.TAIL_LINES


def test_flight_recorder_dumps_are_found_by_prefix_and_cut(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    for r in range(evidence.MAX_DUMPS + 2):
        (tmp_path / ("nccl_trace_rank_%d" % r)).write_bytes(b"\0" * (evidence.DUMP_BYTES + 5))
    got = evidence.flight_recorder({names.FR_DUMP_OLD_ENV: prefix})
    assert len(got["dumps"]) == evidence.MAX_DUMPS and got["left_out"] == 2 and got["dumps"][0]["cut"]


def test_flight_recorder_dumps_are_found_under_either_of_torchs_names(tmp_path):
    """torch 2.15 writes under TORCH_FR_DUMP_TEMP_FILE, older torch under
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE; a user may set either, or both."""
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    (new / "fr_0").write_bytes(b"a")
    (old / "nccl_1").write_bytes(b"b")
    found = evidence.flight_recorder({names.FR_DUMP_ENV: str(new / "fr_")})
    assert [d["file"] for d in found["dumps"]] == [str(new / "fr_0")]
    found = evidence.flight_recorder({names.FR_DUMP_OLD_ENV: str(old / "nccl_")})
    assert [d["file"] for d in found["dumps"]] == [str(old / "nccl_1")]
    both = evidence.flight_recorder({names.FR_DUMP_ENV: str(new / "fr_"), names.FR_DUMP_OLD_ENV: str(old / "nccl_")})
    assert sorted(d["file"] for d in both["dumps"]) == [str(new / "fr_0"), str(old / "nccl_1")]
    same = evidence.flight_recorder({names.FR_DUMP_ENV: str(new / "fr_"), names.FR_DUMP_OLD_ENV: str(new / "fr_")})
    assert len(same["dumps"]) == 1  # one prefix under both names: its dumps once


def test_only_a_failed_attempt_has_a_bundle_and_only_the_named_node_adds_itself():
    ok = _result(2)
    ok.cause = None
    assert evidence.bundle(ok, True, 0, 0, {}) is None
    assert evidence.bundle(_result(2), False, 1, 0, {}) is None  # a bystander
    named = evidence.bundle(_result(8), False, 5, 0, {})
    assert named["node"] == 5 and "nvidia_smi" in named  # None here: no nvidia-smi on this machine
