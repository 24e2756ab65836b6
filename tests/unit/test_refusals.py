"""Issue 29, loose ends: three refusals that were unclear now name the problem
(a huge int, a value whose ``__repr__`` raises, a FIFO or a device as the
entrypoint), as one ``TorchrunInvalidArgument`` from the checks that run before
anything starts."""

import os

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument, shown
from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import validate_shutdown_grace, validate_timeouts
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, plan_call, validate_nproc


class Unprintable:
    def __repr__(self):
        raise RuntimeError("repr is broken")

    __str__ = __repr__


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def refusal(script, **call):
    args = dict(entrypoint=script, entrypoint_args=None, nproc_per_node=1, torchrun_args=None)
    args.update(call)
    with pytest.raises(TorchrunInvalidArgument) as e:
        plan_call(args["entrypoint"], args["entrypoint_args"], args["nproc_per_node"], args["torchrun_args"],
                  StepDefaults(), [os.path.dirname(script)])
    return str(e.value)


def test_a_huge_nproc_is_refused_by_name():
    """Was: ValueError: Exceeds the limit (4300 digits) for integer string
    conversion, raised while the refusal's own message was built."""
    for check in (lambda: validate_nproc(10**5000, "@torchrun(nproc_per_node)"),
                  lambda: validate_timeouts(10**5000, 600)):
        with pytest.raises(TorchrunInvalidArgument) as e:
            check()
        assert "an integer of about 5001 digits" in str(e.value)


def test_a_huge_nproc_in_a_call(script):
    message = refusal(script, nproc_per_node=10**5000)
    assert "nproc_per_node=an integer of about 5001 digits" in message and "at most" in message


@pytest.mark.parametrize("call", [
    dict(nproc_per_node=Unprintable()),
    dict(entrypoint=Unprintable()),
    dict(entrypoint_args=[Unprintable()]),
    dict(entrypoint_args={"lr": Unprintable()}),
    dict(entrypoint_args={Unprintable(): 1}),
    dict(torchrun_args={"max_restarts": Unprintable()}),
    dict(torchrun_args={Unprintable(): 1}),
    dict(torchrun_args=["--max-restarts", Unprintable()]),
], ids=["nproc", "entrypoint", "args-list", "args-value", "args-key", "targs-value", "targs-key", "targs-list"])
def test_a_value_whose_repr_raises_is_named_not_raised(script, call):
    """Was: the RuntimeError of the user's __repr__ escaped, as a traceback."""
    message = refusal(script, **call)
    assert "<a Unprintable whose repr() fails: RuntimeError>" in message


@pytest.mark.parametrize("check", [
    lambda: validate_timeouts(Unprintable(), 600),
    lambda: validate_shutdown_grace(Unprintable(), None),
])
def test_a_decorator_value_whose_repr_raises(check):
    with pytest.raises(TorchrunInvalidArgument, match="whose repr"):
        check()


def test_shown_is_repr_for_ordinary_values():
    for value in ("x", 3, [1, "a"], {"k": None}, 2**80):
        assert shown(value) == repr(value)


def test_a_fifo_is_named_and_never_opened(script, tmp_path):
    """Was: "does not exist". Opening a FIFO would block; stat does not."""
    os.mkfifo(str(tmp_path / "pipe.py"))
    message = refusal(script, entrypoint="pipe.py")
    assert "is a named pipe (FIFO), not a Python script" in message and "does not exist" not in message


def test_a_link_to_dev_zero_is_named(script, tmp_path):
    os.symlink("/dev/zero", str(tmp_path / "zero.py"))
    message = refusal(script, entrypoint=str(tmp_path / "zero.py"))
    assert "-> /dev/zero) is a character device, not a Python script" in message
