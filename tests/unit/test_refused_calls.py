"""A refused current.torch.run call and nproc's words, without processes:
the message, the gang's cause and the echo, "did you mean", and what
``auto``/``gpu``/``cpu``/``xpu`` come to on a node (issue 28, items 5 and 7)."""

from __future__ import annotations

import os

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import (
    GangAborted, TorchrunCallRefused, TorchrunInvalidArgument, did_you_mean, is_refusal)
from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity
from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import Topology
from metaflow_extensions.torchrun.plugins.torchrun.launch import inputs as inputs_mod
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import (StepDefaults, call_request, plan_call, plan_request,
                                                                     resolve_entrypoint)
from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import nproc_for_keyword
from metaflow_extensions.torchrun.plugins.torchrun.launch import resources as resources_mod
from metaflow_extensions.torchrun.plugins.torchrun.runtime import api as nproc_mod
from metaflow_extensions.torchrun.plugins.torchrun.runtime.context import StepContext
from metaflow_extensions.torchrun.plugins.torchrun.runtime.session import GangSession, same_problem


def entry():
    """A module-level function: a plan's entrypoint without a script."""


class TestDidYouMean:
    @pytest.mark.parametrize("word, choices, expected", [
        ("helo.py", ["hello.py", "flow.py"], " (did you mean 'hello.py'?)"),
        ("max-restart", ["max-restarts", "nnodes"], " (did you mean 'max-restarts'?)"),
        ("zzz", ["hello.py"], ""),
        ("x", [], ""),
    ])
    def test_near_misses_only(self, word, choices, expected):
        assert did_you_mean(word, choices) == expected

    def test_its_own_quoting(self):
        assert did_you_mean("entrypoint_arg", ["entrypoint_args"], "%s=") == " (did you mean entrypoint_args=?)"


class TestEntrypointMessage:
    def test_a_directory_searched_twice_is_named_once_with_the_near_miss(self, tmp_path):
        (tmp_path / "train.py").write_text("print(1)\n")
        with pytest.raises(TorchrunInvalidArgument) as info:
            resolve_entrypoint("trian.py", [str(tmp_path), str(tmp_path) + "/", str(tmp_path / ".")])
        message = info.value.message
        assert message == "entrypoint 'trian.py' does not exist in %s (did you mean 'train.py'?)." % tmp_path

    def test_a_huge_directory_is_listed_only_so_far(self, tmp_path, monkeypatch):
        monkeypatch.setattr(inputs_mod, "LISTED_PER_DIR", 5)
        for i in range(50):
            (tmp_path / ("f%02d.py" % i)).write_text("")
        assert len(inputs_mod.python_files([str(tmp_path)])) <= 5

    def test_an_unknown_torchrun_option_suggests_the_real_one(self):
        with pytest.raises(TorchrunInvalidArgument) as info:
            plan_call(entry, None, None, {"max_restart": 1}, StepDefaults(), [])
        assert "--max-restart (did you mean --max-restarts?)" in info.value.message

    def test_an_unknown_run_keyword_suggests_the_real_one(self):
        with pytest.raises(TorchrunInvalidArgument) as info:
            plan_request(call_request(("train.py",), {"entrypoint_arg": 1}), StepDefaults(), [])
        assert "does not take entrypoint_arg= (did you mean entrypoint_args=?)" in info.value.message


def _session(node, is_local):
    topo = Topology(num_nodes=2, node_index=node, main_addr="127.0.0.1", ports=(1,), is_local=is_local)
    return GangSession(StepContext(GangIdentity("F", "1", "train", "2", 0), StepDefaults(), topo, b"s" * 32))


def _refusal():
    try:
        raise TorchrunCallRefused(1, "flow.py, line 15", "entrypoint 'helo.py' does not exist in /x.")
    except TorchrunCallRefused as e:
        return e


class TestRefusalInTheGang:
    def test_the_message_names_the_call_and_the_line(self):
        assert _refusal().message == (
            "current.torch.run call 1 (flow.py, line 15): entrypoint 'helo.py' does not exist in /x.")
        assert isinstance(_refusal(), TorchrunInvalidArgument)  # what users catch still catches it

    def test_its_cause_has_no_traceback_of_ours(self):
        cause = _session(0, True).step_cause(_refusal())
        assert cause.kind is CauseKind.STEP_FAILED and is_refusal(cause)
        assert cause.summary == ("node 0 refused current.torch.run call 1 (flow.py, line 15): "
                                 "entrypoint 'helo.py' does not exist in /x.")
        assert cause.traceback is None and cause.call == 0

    def test_the_echo_is_brief_in_a_shared_log_and_whole_on_a_cluster(self):
        cause = _session(0, True).step_cause(_refusal())
        local = GangAborted(1, cause, same_log=True).message
        assert "does not exist" not in local and "node 0 refused its current.torch.run call" in local
        cluster = GangAborted(1, cause, same_log=False).message
        assert "node 1 stopped because node 0 failed first: node 0 refused current.torch.run call 1" in cluster
        assert "does not exist in /x" in cluster and "traceback" not in cluster

    def test_other_causes_are_not_shortened(self):
        cause = Cause(CauseKind.STEP_FAILED, "node 0 failed in its step: ValueError: x", node_index=0,
                      exc_type="ValueError", traceback="Traceback...\nValueError: x")
        message = GangAborted(1, cause, same_log=True).message
        assert "node 0 failed in its step: ValueError: x" in message  # said whole, in one line
        assert "Traceback" not in message  # node 0's own error in the same log has it
        assert "Traceback" in GangAborted(1, cause, same_log=False).message  # a cluster: its own log


class TestNprocWords:
    @pytest.mark.parametrize("word, cuda, cpus, expected", [
        ("cpu", 0, 4, 4), ("cpu", 8, 4, 4), ("cpu", None, 3, 3),
        ("gpu", 8, 4, 8), ("gpu", None, 4, None),
        ("auto", 8, 4, 8), ("auto", 0, 4, 4), ("auto", None, 4, None),
        ("xpu", 0, 4, None), ("xpu", 8, 4, None),
    ])
    def test_as_torchrun_means_them(self, word, cuda, cpus, expected):
        count, why = nproc_for_keyword(word, cuda, cpus)
        assert count == expected
        assert bool(why) == (expected is not None)

    def test_gpu_on_a_node_without_one_is_refused(self):
        with pytest.raises(TorchrunInvalidArgument, match="'gpu' but this node has no visible CUDA device"):
            nproc_for_keyword("gpu", 0, 4)

    def test_the_plan_holds_the_number_and_says_the_word(self, monkeypatch):
        monkeypatch.setattr(resources_mod, "cuda_devices", lambda: 0)
        monkeypatch.setattr(resources_mod, "usable_cpus", lambda: 3)
        plan = nproc_mod.with_nproc_resolved(plan_call(entry, None, "auto", None, StepDefaults(), []))
        assert plan.nproc == 3
        assert plan.notes[-1].startswith("nproc_per_node='auto': 3 processes on this node")

    @pytest.mark.parametrize("asked, word, expected", [(2, "gpu", 2), (0, "auto", 5), (None, "auto", None),
                                                       (0, "xpu", None)])
    def test_where_the_driver_cannot_say_torch_is_asked(self, monkeypatch, asked, word, expected):
        monkeypatch.setattr(resources_mod, "cuda_devices", lambda: None)  # MIG: undecided
        monkeypatch.setattr(resources_mod, "usable_cpus", lambda: 5)
        monkeypatch.setattr(resources_mod, "count_with_torch", lambda kind, python: asked)
        plan = plan_call(entry, None, word, None, StepDefaults(), [])
        if expected is None:
            with pytest.raises(TorchrunInvalidArgument):
                nproc_mod.with_nproc_resolved(plan)
        else:
            assert nproc_mod.with_nproc_resolved(plan).nproc == expected

    def test_torch_is_really_asked_in_a_child(self):
        import sys

        from metaflow_extensions.torchrun.plugins.torchrun.host.devices import count_with_torch
        assert count_with_torch("cuda", sys.executable) == 0  # no GPU here
        assert count_with_torch("cuda", os.devnull) is None  # not a python


def test_a_long_refusal_is_still_known_as_the_same_problem():
    """The cause's message is cut on the wire: an echo is recognised all the same."""
    try:
        raise TorchrunCallRefused(1, "flow.py, line 15", "x" * 10000)
    except TorchrunCallRefused as e:
        error = e
    root = Cause.from_wire(_session(0, True).step_cause(error).to_wire())
    assert root is not None and root.message != error.message  # cut
    node1 = _session(1, True)
    assert same_problem(node1.step_cause(error), root)
    other = TorchrunCallRefused(1, "flow.py, line 15", "y" * 10000)
    assert not same_problem(node1.step_cause(other), root)
