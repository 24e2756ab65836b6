"""The card says what ran (issue 36, item 4), a refused call's card says only
that, the failure is drawn where the failing rank ended, and the small things:
``print(result)`` is one short line, Metaflow's banner names this extension."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

import records
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import RankStatus
from metaflow_extensions.torchrun.plugins.torchrun.card import content as card_content
from metaflow_extensions.torchrun.plugins.torchrun.card import timeline
from metaflow_extensions.torchrun.plugins.torchrun.record import what_ran
from metaflow_extensions.torchrun.plugins.torchrun.record.result import RankRecord, TorchrunResult
from metaflow_extensions.torchrun.plugins.torchrun.base.version import __version__

T0 = 1_800_000_000.0


def test_secret_looking_arguments_are_masked():
    argv = ["--epochs", "3", "--api-token", "s3cr3t", "--hf_key=abc", "--Password", "p", "--secret-path=/x",
            "--lr", "0.1", "--flag", "--token"]
    assert what_ran.mask_argv(argv) == ["--epochs", "3", "--api-token", "****", "--hf_key=****", "--Password",
                                        "****", "--secret-path=****", "--lr", "0.1", "--flag", "--token"]
    assert what_ran.mask_value({"steps": 5, "wandb_api_key": "k", "TOKEN": 1}) == {
        "steps": "5", "wandb_api_key": "****", "TOKEN": "****"}
    assert what_ran.mask_value([1, "a" * 500])[1].endswith("…")


# What the hand-written record (a plain dict, before ``Ran``) stored for a script and a function.
STORED = [
    '{"entrypoint": "scripts/train.py", "kind": "script", "args": ["--api-token", "****", "--epochs", "3"], '
    '"command": ["python", "-m", "x.agent", "--nnodes=16"], "log_dir": "/tmp/logs/F-1/train-2-0/c0/node-0", '
    '"node": 0, "versions": {"torch": "2.13.0", "metaflow": "2.19.39", "python": "3.11.9", "metaflow-torchrun": "0.3"}}',
    '{"entrypoint": "mod:fn", "kind": "function", "args": {"steps": "5", "api_key": "****"}, "command": [], '
    '"log_dir": "", "node": 3, "versions": {}}',
    '{"entrypoint": "mod:fn", "kind": "function", "args": "5", "command": ["a"], "log_dir": "", "node": 1, '
    '"versions": {}}',
]


def _ran():
    return what_ran.Ran.from_wire(json.loads(STORED[0]))


@pytest.mark.parametrize("stored", STORED)
def test_a_stored_what_ran_reads_back_and_writes_the_same_json(stored):
    ran = what_ran.Ran.from_wire(json.loads(stored))
    assert json.dumps(ran.to_wire()) == stored
    assert what_ran.Ran.from_wire(ran.to_wire()) == ran
    result = TorchrunResult(command=[], node_index=0, num_nodes=1, nproc_per_node=1, exit_code=0, started_at=T0,
                            ended_at=T0, ran=ran)
    assert json.loads(result.to_json())["ran"] == json.loads(stored)
    assert json.loads(replace(result, ran=None).to_json())["ran"] == {}  # none: as the free dict stored it


def test_an_odd_stored_what_ran_reads_leniently():
    odd = {"entrypoint": "e" * 5000, "kind": "bash", "args": 5, "command": [1, "a", None, "b" * 900] + ["c"] * 80,
           "log_dir": ["x"], "node": -1, "versions": {"torch": 2, "python": "3.11", "k" * 99: "v"}, "extra": 1}
    ran = what_ran.Ran.from_wire(odd)
    assert ran == what_ran.Ran("e" * 4096, "script", [], ("a", "b" * 800) + ("c",) * 61, "", 0, {"python": "3.11"})
    assert what_ran.Ran.from_wire({**odd, "args": {"k": [1]}}).args == {"k": "[1]"}
    for nothing in ({}, {"entrypoint": 5}, [], "ran", None):  # nothing that says what ran
        assert what_ran.Ran.from_wire(nothing) is None
    assert what_ran.rows(None, 4) == []


def test_the_what_ran_rows_name_the_entrypoint_arguments_command_logs_and_versions():
    rows = dict((k, v) for k, v in what_ran.rows(_ran(), num_nodes=16))
    assert rows["version of torch"] == "2.13.0"
    assert rows["entrypoint (script)"] == "scripts/train.py"
    assert rows["arguments"] == "--api-token **** --epochs 3"
    assert rows["node 0's torchrun command"].startswith("python -m x.agent")
    assert rows["log folder, node 0"] == "/tmp/logs/F-1/train-2-0/c0/node-0"
    assert rows["log folder, node 7"] == "/tmp/logs/F-1/train-2-0/c0/node-7"
    assert rows["log folder, …"] == "8 more nodes, the same path with their index"
    assert {"version of torch", "version of metaflow", "version of python", "version of metaflow-torchrun"} <= set(rows)


def test_versions_are_read_without_importing_torch():
    out = subprocess.run([sys.executable, "-c",
                          "import sys; from metaflow_extensions.torchrun.plugins.torchrun.record import what_ran;"
                          "v = what_ran.versions(); print(v['metaflow-torchrun'], 'torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [__version__, "False"], out.stderr


def test_a_refused_calls_card_says_so_and_shows_no_empty_tables():
    result = TorchrunResult(command=[], node_index=0, num_nodes=2, nproc_per_node="", exit_code=None,
                            started_at=T0, ended_at=T0 + 1, call=-1,
                            cause=records.cause({"kind": "step_failed", "exc_type": "TorchrunCallRefused",
                                   "summary": "node 0 refused current.torch.run call 1",
                                   "message": "current.torch.run call 1 (flow.py, line 9): entrypoint 'x.py' does not exist"}))
    assert card_content.refusal_reason(result).endswith("does not exist")

    class Md:
        def __init__(self, text):
            self.text = text

    class Tb:
        def __init__(self, rows, headers):
            self.rows = rows

    real = card_content.Markdown, card_content.Table
    card_content.Markdown, card_content.Table = Md, Tb
    try:
        parts = card_content.build_components(result, "F", "F/1/train/2", "gloo")
    finally:
        card_content.Markdown, card_content.Table = real
    text = "\n".join(p.text for p in parts if isinstance(p, Md))
    assert "Refused before any rank started:" in text and "does not exist" in text
    for absent in ("Topology", "## Ranks", "passed every check", "None", "2 x"):
        assert absent not in text, absent
    assert not [p for p in parts if isinstance(p, Tb)]  # no empty table (no attempts, nothing ran)
    ran = TorchrunResult(command=["torchrun"], node_index=0, num_nodes=1, nproc_per_node=1, exit_code=0,
                         started_at=T0, ended_at=T0 + 1, ranks=[RankRecord(0, 0)], cause=result.cause)
    assert card_content.refusal_reason(ran) is None  # ranks ran: not a refusal


def test_the_failure_is_drawn_where_the_failing_rank_ended():
    ranks = {0: [RankStatus(rank=0, local_rank=0, end=T0 + 5.0), RankStatus(rank=1, local_rank=1, end=T0 + 3.0)]}
    result = TorchrunResult(command=[], node_index=0, num_nodes=1, nproc_per_node=2, exit_code=1,
                            started_at=T0, ended_at=T0 + 9, cause=records.cause({"kind": "failed", "node_index": 0,
                                                                                 "rank": 1, "summary": "x",
                                                                                 "time": T0 + 5.4}))
    assert timeline.from_result(result, ranks).failed_at == T0 + 3.0
    assert timeline.from_result(result, {}).failed_at == T0 + 5.4  # no record of the rank: when it was reported


def test_print_result_is_one_short_line():
    result = TorchrunResult(command=["x"] * 200, node_index=1, num_nodes=4, nproc_per_node=8, exit_code=0,
                            started_at=T0, ended_at=T0 + 12.34, ranks=[RankRecord(r, r) for r in range(8)],
                            log_dir="/tmp/logs/F-1/train-2-0/c0/node-1", stacks={r: "x" * 1000 for r in range(8)})
    text = str(result)
    assert "\n" not in text and len(text) < 160
    assert text == "TorchrunResult(node 1 of 4, exit code 0, 8 ranks here, 12.3 s, logs: /tmp/logs/F-1/train-2-0/c0/node-1)"
    assert repr(result).startswith("TorchrunResult(command=")  # every field, as before


def test_print_result_of_a_node_a_spare_replaced_says_taken_out():
    """Its last start sat out (no exit code): it ran its ranks until the swap, and said `not run`."""
    out = TorchrunResult(["x"], 1, 3, 2, None, T0, T0 + 9.0, role="out")
    assert "node 1 of 3, taken out," in str(out) and "not run" not in str(out)
    assert "node 2 of 3, a spare, not run," in str(TorchrunResult(["x"], 2, 3, 2, None, T0, T0 + 9.0, role="spare"))


def test_metaflows_banner_names_this_extension_and_its_version():
    out = subprocess.run([sys.executable, "-c", "from metaflow.metaflow_version import get_version; print(get_version())"],
                         capture_output=True, text=True, timeout=120)
    assert "torchrun(" in out.stdout and "<unk>" not in out.stdout, out.stdout + out.stderr


class _Task:
    def __init__(self, pathspec):
        self.pathspec = pathspec
        self.id = pathspec.rsplit("/", 1)[1]


def test_card_view_of_a_step_resolves_to_its_control_task(monkeypatch):
    import metaflow

    from metaflow_extensions.torchrun.plugins.torchrun.compat import control_task_of

    tasks = {"F/1/train": [_Task("F/1/train/2_node_1"), _Task("F/1/train/2"), _Task("F/1/train/2_node_2")],
             "F/2/train": [_Task("F/2/train/t-node-1"), _Task("F/2/train/t-control")]}
    monkeypatch.setattr(metaflow, "Step", lambda pathspec: tasks[pathspec])
    assert control_task_of(_Task("F/1/train/2_node_1")).pathspec == "F/1/train/2"  # local: "<control>_node_<i>"
    assert control_task_of(_Task("F/2/train/t-node-1")).pathspec == "F/2/train/t-control"  # the one non-worker
    plain = _Task("F/1/start/1")
    assert control_task_of(plain) is plain  # not a worker: as Metaflow resolved it
