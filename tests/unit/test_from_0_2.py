"""Pure parts of running metaflow-torchrun 0.2 code (issue 25): master_port,
one message for every problem, 0.1/0.2 calls, the single-node launcher's pieces."""

import re

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import Problems, TorchrunInvalidArgument, raise_all
from metaflow_extensions.torchrun.plugins.torchrun.launch import plan
from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import validate_args_as
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import call_request, legacy_shape, plan_request
from metaflow_extensions.torchrun.plugins.torchrun.host import console
from metaflow_extensions.torchrun.plugins.torchrun.runtime import single_node


def test_master_port_pins_the_rendezvous_port_with_one_line():
    options = {"master-port": "41000", "max-restarts": "0"}
    port, notes = plan.legacy_rdzv_port(options, "torchrun_args")
    assert port == 41000 and options == {"max-restarts": "0"}
    assert len(notes) == 1 and "@torchrun(rdzv_port=41000)" in notes[0]


@pytest.mark.parametrize("value", ["x", True, "70000"])
def test_a_bad_master_port_is_named(value):
    with pytest.raises(TorchrunInvalidArgument, match="master_port"):
        plan.legacy_rdzv_port({"master-port": value}, "torchrun_args")


def test_plan_call_names_every_problem_at_once(tmp_path):
    with pytest.raises(TorchrunInvalidArgument) as e:
        plan.plan_call("missing.py", {"a": object()}, 0, {"nnodes": 2, "max_restarts": ""},
                       plan.StepDefaults(), [str(tmp_path)])
    msg = str(e.value)
    assert "problems" in msg and "missing.py" in msg and "--nnodes" in msg and "['max_restarts']" in msg, msg


def test_plan_call_carries_master_port_none_notes_and_true_keys(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    planned = plan.plan_call(str(script), {"bf16": True, "resume": None}, 1, {"master_port": 41001},
                             plan.StepDefaults(), [str(tmp_path)])
    assert planned.entry_argv == ["--bf16", "--resume"]
    assert planned.rdzv_port == 41001 and "master-port" not in planned.options
    assert planned.true_keys == ("bf16",)
    assert len(planned.notes) == 2


def test_args_as_0_2_spells_values_and_needs_no_hint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    planned = plan.plan_call(str(script), {"bf16": True, "sizes": [1, 2]}, 1, None,
                             plan.StepDefaults(args_as="0.2"), [str(tmp_path)])
    assert planned.entry_argv == ["--bf16", "true", "--sizes", "[1, 2]"] and planned.true_keys == ()


def test_validate_args_as():
    assert validate_args_as(None, "x") == "ours" and validate_args_as(" 0.2 ", "x") == "0.2"
    with pytest.raises(TorchrunInvalidArgument, match="0.2"):
        validate_args_as("json", "x")


@pytest.mark.parametrize(
    "entrypoint, args, extra, needle",
    [
        ("t.py", None, {"master_port": 1}, "@torchrun(port=N) pins the gang service"),
        ("t.py", None, {"entrypoint_args_raw": []}, "entrypoint_args=[...]"),
        ("t.py", None, {"local_output_dir": "x"}, "@model/@checkpoint"),
        ("t.py", None, {"bogus": 1}, "it takes entrypoint, entrypoint_args"),
        ({"nproc_per_node": 2}, "t.py", {}, "0.2 took torchrun_args first"),
    ],
)
def test_0_1_and_0_2_calls_are_refused_with_what_to_write(entrypoint, args, extra, needle):
    with pytest.raises(TorchrunInvalidArgument, match=re.escape(needle)):
        plan_request(call_request((entrypoint, args), extra), plan.StepDefaults(), [])


def test_a_modern_call_is_not_read_as_0_2s():
    assert legacy_shape("t.py", {"a": 1}) is None and legacy_shape(print, [1]) is None


def test_problems_collect_and_flatten():
    problems = Problems()
    problems.check(raise_all, ["a", "b"])
    problems.add("c")
    assert problems.check(lambda: 5) == 5
    with pytest.raises(TorchrunInvalidArgument) as e:
        problems.raise_all()
    assert str(e.value).endswith("3 problems:\n- a\n- b\n- c")
    raise_all([])  # nothing to say


def test_deprecation_lines_are_said_once_per_step():
    said = []
    console.say_once("flow/1/train/2", ["x", "y"], said.append)
    console.say_once("flow/1/train/2", ["x"], said.append)
    console.say_once("flow/1/train/3", ["x"], said.append)
    assert said == ["x", "y", "x"]


def test_the_steps_decorators_are_read_from_the_flow_in_main(monkeypatch):
    import sys
    import types

    class Deco:
        name, attributes = "resources", {"gpu": 2}

    def train(self):
        pass

    train.decorators = [Deco()]
    main = types.ModuleType("__main__")
    main.MyFlow = type("MyFlow", (), {"train": train})
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert single_node.step_decorator_specs("MyFlow", "train") == [("resources", {"gpu": 2})]
    assert single_node.step_decorator_specs("OtherFlow", "train") == []


API = "TorchrunSingleNodeMultiGPU().run"


def _single_node_refusal(tmp_path, *args, **kwargs):
    """What 0.2's single-node launcher says of a call, planned as its run()
    plans it (call_request in 0.2's order), before anything starts."""
    request = plan.call_request(args, kwargs, api=API, order=plan.ORDER_0_2)
    with pytest.raises(TorchrunInvalidArgument) as e:
        plan.plan_request(request, plan.StepDefaults(), [str(tmp_path)])
    return str(e.value)


@pytest.mark.parametrize(
    "args, kwargs, said",
    [
        # Was Python's TypeError (an unexpected keyword argument 'entry_point').
        ((), {"entry_point": "t.py"}, API + " does not take entry_point= (did you mean entrypoint=?)"),
        ((), {"entrypoint": "t.py", "entrypoint_arg": [1]}, API + " does not take entrypoint_arg= (did you mean "
                                                              "entrypoint_args=?)"),
        ((), {}, API + " needs an entrypoint"),
        (({}, "t.py", None, 1, "x"), {}, API + " takes at most 4 positional arguments (torchrun_args, entrypoint, "
                                               "entrypoint_args, nproc_per_node), not 5"),
        (({}, "t.py"), {"entrypoint": "t.py"}, "entrypoint is given twice: as positional argument 2"),
        # current.torch.run's order given to 0.2's launcher: said once, naming the order.
        (("t.py", {"lr": 1}), {}, API + "'s first argument is torchrun_args (metaflow-torchrun 0.2's order"),
    ],
)
def test_the_single_node_launcher_refuses_a_wrong_call_naming_it(tmp_path, args, kwargs, said):
    (tmp_path / "t.py").write_text("print(1)\n")
    message = _single_node_refusal(tmp_path, *args, **kwargs)
    assert said in message and message.count(API) <= 1, message


def test_the_single_node_launcher_keeps_0_2s_order(tmp_path):
    (tmp_path / "t.py").write_text("print(1)\n")
    request = plan.call_request(({"max_restarts": 0}, "t.py", {"tag": "p"}, 2), {}, api=API, order=plan.ORDER_0_2)
    call = plan.plan_request(request, plan.StepDefaults(), [str(tmp_path)])
    assert (call.script, call.entry_argv, call.nproc, call.options) == (
        str(tmp_path / "t.py"), ["--tag", "p"], 2, {"max-restarts": 0})
    # and keywords, in any order, as 0.2's users wrote them
    request = plan.call_request((), {"nproc_per_node": 2, "entrypoint": "t.py"}, api=API, order=plan.ORDER_0_2)
    assert plan.plan_request(request, plan.StepDefaults(), [str(tmp_path)]).nproc == 2


def test_the_single_node_launchers_run_takes_any_call_and_shows_0_2s_signature():
    # Any shape reaches run()'s own checks (here: not in a step), never Python's TypeError.
    from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunException

    with pytest.raises(TorchrunException, match="can only be called in a step's code"):
        single_node.SingleNodeLauncher().run(entry_point="x.py")
    import inspect

    assert list(inspect.signature(single_node.SingleNodeLauncher.run).parameters) == [
        "self", "torchrun_args", "entrypoint", "entrypoint_args", "nproc_per_node"]
