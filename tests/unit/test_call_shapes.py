"""Every wrong call of ``current.torch.run`` is one ``TorchrunCallRefused``
naming every problem (issue 52).

A keyword run() does not take, no entrypoint, more positional arguments than
it has, a value given twice, 0.2's ``run(torchrun_args, entrypoint)``, and
any mistake in the values themselves: all named in one message, each
unknown keyword with its near miss. Before, a call without ``entrypoint``
was Python's ``TypeError`` (an Internal error of 67 lines), and an unknown
keyword hid every other problem of the same call.

The calls go through ``current.torch``'s own ``run`` and the runtime's
``api.run`` with a session that has no gang: what comes after planning
(the preflight and the call itself) is replaced by a stand-in.

The fuzzer is bounded like tests/unit/test_fuzz_inputs.py: ``FUZZ_EXAMPLES``
examples (default 300) from seed ``FUZZ_SEED`` (``TORCHRUN_FUZZ_EXAMPLES``,
``TORCHRUN_FUZZ_SEED``).
"""

from __future__ import annotations

import difflib
import os
import pathlib
from types import SimpleNamespace

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunCallRefused, TorchrunException
from metaflow_extensions.torchrun.plugins.torchrun.handle import TorchrunHandle
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import LEGACY_RUN_KEYWORDS, RUN_KEYWORDS, StepDefaults
from metaflow_extensions.torchrun.plugins.torchrun.runtime import api

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("TORCHRUN_FUZZ_EXAMPLES", "300"))
FUZZ_SEED = int(os.environ.get("TORCHRUN_FUZZ_SEED", "52"))
HERE = os.path.basename(__file__)
ACCEPTED = object()


def entry_function(**kwargs):
    """A module-level function: an entrypoint the ranks can import."""


@pytest.fixture(scope="module")
def flow_dir(tmp_path_factory):
    where = tmp_path_factory.mktemp("flow")
    (where / "train.py").write_text("print(1)\n")
    return where


@pytest.fixture
def handle(flow_dir, monkeypatch):
    """``current.torch`` of a node whose gang is not there: a call is planned
    for real, and an accepted one stops before anything starts."""
    monkeypatch.setattr(api, "before_first_call", lambda session: None)
    monkeypatch.setattr(api, "run_call", lambda session, plan: ACCEPTED)
    monkeypatch.chdir(flow_dir)
    context = SimpleNamespace(flow_dir=str(flow_dir), notes_key="k", defaults=StepDefaults(), is_control=False)
    session = SimpleNamespace(context=context, calls_made=0)
    return TorchrunHandle(lambda: session)  # type: ignore[arg-type, return-value]


def _refusal(handle, *args, **kwargs) -> str:
    with pytest.raises(TorchrunCallRefused) as info:
        handle.run(*args, **kwargs)
    message = info.value.message
    assert message.startswith("current.torch.run call 1 (%s, line " % HERE), message
    return message


def test_no_entrypoint_was_a_type_error_and_is_a_refusal_with_the_near_miss(handle):
    message = _refusal(handle, entry_point="train.py")
    assert "current.torch.run does not take entry_point= (did you mean entrypoint=?)" in message
    assert "problems" not in message  # the one mistake, said once
    assert "needs an entrypoint" in _refusal(handle, entrypoint_args=["--x"])
    assert "needs an entrypoint" in _refusal(handle)


def test_two_mistakes_in_one_call_are_named_in_one_message(handle):
    message = _refusal(handle, entrypoint="train.py", entrypoint_arg={"a": 1}, torchrun_args={"max_restart": 2})
    assert message.count("\n- ") == 2, message
    assert "does not take entrypoint_arg= (did you mean entrypoint_args=?)" in message
    assert "unknown torchrun option --max-restart (did you mean --max-restarts?)" in message


def test_a_torchrun_option_given_to_run_says_where_it_goes(handle):
    message = _refusal(handle, "train.py", max_restart=2)
    assert "does not take max_restart= (did you mean torchrun_args={'max_restarts': 2}?)" in message
    message = _refusal(handle, "train.py", nnodes=2)
    assert "does not take nnodes= (torchrun's --nnodes is set by @torchrun: the node count is num_parallel" in message


def test_wrong_positional_use_is_named_with_the_rest(handle):
    message = _refusal(handle, "trian.py", None, None, None, "extra", entrypoint="train.py", self=1)
    assert "takes at most 4 positional arguments (entrypoint, entrypoint_args, nproc_per_node, torchrun_args), " \
           "not 5" in message
    assert "entrypoint is given twice: as positional argument 1 and as entrypoint=." in message
    assert "does not take self=;" in message
    assert "entrypoint 'trian.py' does not exist in " in message and "(did you mean 'train.py'?)" in message
    assert message.count("\n- ") == 4, message


def test_0_2s_shape_is_named_once(handle):
    message = _refusal(handle, {"nnodes": 2}, "train.py")
    assert "first argument is the entrypoint, not {'nnodes': 2}: metaflow-torchrun 0.2 took torchrun_args first" \
           in message
    assert "problems" not in message  # not also "entrypoint must be the path of a Python script"


def test_a_right_call_in_any_shape_is_accepted(handle):
    assert handle.run("train.py") is ACCEPTED
    assert handle.run("train.py", ["--x"], 2, {"max_restarts": 1}) is ACCEPTED
    assert handle.run(entry_function, entrypoint_args={"a": 1}) is ACCEPTED
    assert handle.run(entrypoint="train.py", nproc_per_node=1) is ACCEPTED


def test_the_signature_users_see_is_the_documented_one():
    import inspect

    params = inspect.signature(TorchrunHandle.run).parameters
    assert list(params) == ["self", "entrypoint", "entrypoint_args", "nproc_per_node", "torchrun_args"]
    assert params["entrypoint"].default is inspect.Parameter.empty


# ------------------------------------------------------------------ the fuzzer

NEAR = ["entry_point", "entrypoint_arg", "entrypointargs", "entry", "nproc", "nproc_per_nodes", "torchrun_arg",
        "torchrunargs", "max_restart", "max_restarts", "master_port", "nnodes", "self", "args", "kwargs", "",
        "Entrypoint", "entrypoint_args_raw", "local_output_dir", "rdzv_conf", "--max-restarts", "-m"]
NAME = st.one_of(st.sampled_from(list(RUN_KEYWORDS) + NEAR), st.text(max_size=8))
VALUE = st.one_of(
    st.sampled_from(["train.py", "trian.py", "", "auto", "gpu", "--x", "-1", "\0", 0, 1, 2, -1, 2.5, True, False, None,
                     b"train.py", pathlib.Path("train.py"), entry_function, (lambda: None), object()]),
    st.lists(st.sampled_from(["--x", "1", 1, None, True]), max_size=3),
    st.dictionaries(st.sampled_from(["lr", "max_restarts", "max_restart", "nnodes", "--x", ""]),
                    st.sampled_from([1, "x", None, True, False, [1, 2]]), max_size=2),
)


def expected_problems(args, kwargs):
    """What the refusal must name, from run()'s documented signature alone."""
    expected = []
    if len(args) > len(RUN_KEYWORDS):
        expected.append("takes at most %d positional arguments" % len(RUN_KEYWORDS))
    near = []
    for name in kwargs:
        if name not in RUN_KEYWORDS:
            close = difflib.get_close_matches(name, RUN_KEYWORDS, n=1, cutoff=0.6)
            near.extend(close)
            written = name if name.isidentifier() else repr(name)
            if name in LEGACY_RUN_KEYWORDS:  # what to write instead, not a near miss
                expected.append("does not take %s= (metaflow-torchrun 0.1/0.2): " % name)
            else:
                expected.append("does not take %s=%s" % (written, " (did you mean %s=?)" % close[0] if close else ""))
        elif RUN_KEYWORDS.index(name) < len(args):
            expected.append("%s is given twice" % name)
    if not args and "entrypoint" not in kwargs and "entrypoint" not in near:
        expected.append("needs an entrypoint")
    return expected


@seed(FUZZ_SEED)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=st.lists(VALUE, max_size=6), kwargs=st.dictionaries(NAME, VALUE, max_size=4))
def test_no_call_is_anything_but_accepted_or_one_refusal_naming_every_problem(handle, args, kwargs):
    try:
        result = handle.run(*args, **kwargs)
    except TorchrunCallRefused as e:
        message = e.message
        for problem in expected_problems(args, kwargs):
            assert problem in message, (problem, message)
        lines = message.splitlines()
        if len(lines) > 1:  # several problems: counted, one line each
            assert lines[0].endswith("%d problems:" % (len(lines) - 1)), message
        return
    except TorchrunException as e:  # never reached: every refusal of a call is the call's
        raise AssertionError("not a TorchrunCallRefused: %r" % e)
    assert result is ACCEPTED
    assert not expected_problems(args, kwargs)
