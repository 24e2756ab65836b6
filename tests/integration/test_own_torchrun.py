"""Code from the ecosystem on us (issue 41): a step that builds its own torchrun
command from 0.2's ``current.torch.torchrun_args`` (Outerbounds' TorchTune plugin
does), and an HfArgumentParser bool that defaults to True given ``False``. One
run of tests/flows/own_torchrun_flow.py, read by both tests."""

import os

import pytest

from .helpers import Gang, describe, output

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    gang = Gang(tmp_path_factory.mktemp("own_torchrun"))
    try:
        proc = gang.run(flow="own_torchrun_flow.py", timeout=300)
        yield gang, proc, output(proc)
    finally:
        leaked = gang.leaks()
        gang.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)


def test_a_command_built_from_torchrun_args_trains_at_2_by_2(ran):
    gang, proc, text = ran
    assert proc.returncode == 0, text[-6000:]
    args = gang.reports("args-")
    assert sorted(args) == [0, 1]
    for node, values in args.items():
        assert values["nnodes"] == 2 and values["node_rank"] == node and values["nproc_per_node"] == 2, values
        assert values["master_addr"] == "127.0.0.1" and values["type_of_port"] == "int", values
    assert args[0]["master_port"] == args[1]["master_port"]  # every node the same port, unasked
    trained = gang.reports("train-")
    assert sorted(trained) == [0, 1, 2, 3]
    assert {r["world"] for r in trained.values()} == {4}
    assert all(r["last"] < r["first"] / 100 for r in trained.values()), trained
    assert len({r["weights"] for r in trained.values()}) == 1  # one model across the 4 ranks, its gradients averaged


def test_false_for_a_bool_that_defaults_to_true_is_said_once_and_false_as_text_passes(ran):
    gang, proc, text = ran
    assert proc.returncode == 0, text[-6000:]
    assert {r["use_feature"] for r in gang.reports("hf-bool-").values()} == {True}  # left out: the default
    said = [line for line in text.splitlines() if "False leaves --use_feature out" in line]
    assert len(said) == 1, text[-6000:]  # once per step, not once per node or call
    assert "write 'use_feature': 'false'" in said[0]
    # docs/from-0.2.md quotes this line as the run says it.
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "from-0.2.md"), encoding="utf-8") as f:
        quoted = [q for q in f.read().splitlines() if q.startswith("@torchrun: entrypoint_args: False leaves")]
    assert quoted and quoted[0] in said[0], (quoted, said[0])
    assert {r["use_feature"] for r in gang.reports("hf-text-").values()} == {False}  # 'false' reaches the parser
