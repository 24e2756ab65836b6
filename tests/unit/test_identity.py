"""identity.py: one gang id per attempt of a step, one rendezvous id per call."""

import re

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity


def rdzv_id_for(flow, run_id, step, task_id, attempt):
    return GangIdentity(flow, run_id, step, task_id, attempt).gang_id


SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


class TestRdzvId:
    def test_deterministic(self):
        a = rdzv_id_for("TrainFlow", "1712", "train", "5", 0)
        assert a == rdzv_id_for("TrainFlow", "1712", "train", "5", 0)
        assert SAFE.match(a)

    def test_differs_per_attempt(self):
        ids = {rdzv_id_for("F", "1", "s", "5", attempt) for attempt in range(5)}
        assert len(ids) == 5

    def test_differs_per_control_task(self):
        assert rdzv_id_for("F", "1", "s", "5", 0) != rdzv_id_for("F", "1", "s", "6", 0)

    def test_differs_per_run_step_and_flow(self):
        base = rdzv_id_for("F", "1", "s", "5", 0)
        assert base != rdzv_id_for("F", "2", "s", "5", 0)
        assert base != rdzv_id_for("F", "1", "t", "5", 0)
        assert base != rdzv_id_for("G", "1", "s", "5", 0)

    @pytest.mark.parametrize(
        "run_id, task_id",
        [
            ("argo-trainflow-abc/def", "control-0"),
            ("sfn:123 456", "t@x#1"),
            ("run$(id)`x`", "a/b\\c"),
            ("1712345678901234", "9"),
            ("kubernetes-abc.def_1", "task%20"),
        ],
    )
    def test_only_safe_characters(self, run_id, task_id):
        assert SAFE.match(rdzv_id_for("TrainFlow", run_id, "train_step", task_id, 3))

    @pytest.mark.parametrize("flow", ["FlöwFlow", "数据Flow", "Flow²"])
    def test_only_ascii_even_for_unicode_names(self, flow):
        # Flow and step names are Python identifiers, which may be non-ASCII;
        # str.isalnum() alone would let those letters through.
        rid = rdzv_id_for(flow, "1", "trăin", "2", 0)
        assert SAFE.match(rid)
        assert rid == rdzv_id_for(flow, "1", "trăin", "2", 0)

    def test_each_call_has_its_own_rendezvous_id(self):
        g = GangIdentity("F", "1", "s", "5", 2)
        ids = [g.call_id(k) for k in range(3)]
        assert len(set(ids)) == 3
        assert all(i.startswith(g.gang_id) and SAFE.match(i) for i in ids)
        assert g.call_id(0) != GangIdentity("F", "1", "s", "5", 3).call_id(0)


class TestLogKey:
    """Issue 28, item 4: the per-rank logs are grouped by run, the unit a user
    looks for and retention keeps whole; then by the step's attempt and call."""

    def test_run_then_step_attempt_then_call(self):
        key = GangIdentity("TrainFlow", "1712", "train", "5", 1).log_key(2)
        assert (key.run, key.step, key.call) == ("TrainFlow-1712", "train-5-1", "c2")

    def test_every_step_and_call_of_a_run_shares_its_run_directory(self):
        keys = [GangIdentity("F", "1", step, task, attempt).log_key(call)
                for step, task in (("a", "2"), ("b", "7")) for attempt in (0, 1) for call in (0, 1)]
        assert {k.run for k in keys} == {"F-1"}
        assert len({(k.step, k.call) for k in keys}) == len(keys)
        assert GangIdentity("F", "2", "a", "2", 0).log_key(0).run != keys[0].run
        assert GangIdentity("G", "1", "a", "2", 0).log_key(0).run != keys[0].run

    @pytest.mark.parametrize("run_id, task_id", [
        ("argo-trainflow-abc/def", "control-0"), ("../..", "../x"), ("a/../../b", "/"), ("数据", "..")])
    def test_plain_directory_names_whatever_the_ids(self, run_id, task_id):
        key = GangIdentity("TrainFlow", run_id, "train", task_id, 0).log_key(0)
        for part in (key.run, key.step, key.call):
            assert SAFE.match(part) and not part.startswith(".") and "/" not in part
