"""@torchrun(spares=K) as the step reads it: every value that cannot work is
refused at step_init, naming the problem and the fix, and an accepted one
reaches the StepDefaults each task's calls start from."""

from __future__ import annotations

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import Problems, TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.inputs import (
    MAX_SPARES,
    check_spares_fit,
    validate_spares,
)
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
from metaflow_extensions.torchrun.plugins.torchrun.spec import ATTRIBUTE_DEFAULTS, read_step_spec, step_defaults


def _read(entries=("3",), **attributes):
    """The step's spec as step_init reads it, and every problem it kept."""
    problems = Problems()
    spec = read_step_spec(dict(ATTRIBUTE_DEFAULTS, **attributes), [], list(entries), ["flow.py", "run"], problems)
    return spec, problems.messages


@pytest.mark.parametrize("value", [True, False, -1, MAX_SPARES + 1, "1", 1.0, [1]])
def test_spares_must_be_a_small_whole_number(value):
    with pytest.raises(TorchrunInvalidArgument) as e:
        validate_spares(value, 2)
    assert str(e.value).startswith("@torchrun(spares=")
    assert "a whole number of spare nodes from 0 to %d" % MAX_SPARES in str(e.value)


def test_spares_within_bounds_are_taken_as_given():
    assert validate_spares(None, 0) == 0 and validate_spares(0, 0) == 0
    assert validate_spares(1, 1, ["2"]) == 1 and validate_spares(MAX_SPARES, 1) == MAX_SPARES


@pytest.mark.parametrize("attributes", [{}, {"restarts": 0}])
def test_spares_without_restarts_are_refused_naming_restarts(attributes):
    """A swap is an in-step restart: with none allowed, a spare could never come in."""
    _, said = _read(spares=1, **attributes)
    assert said == ["@torchrun(spares=1) without restarts: a spare comes in only in an in-step restart, and "
                    "restarts=0 (the default) allows none. Set restarts=N (N >= 1; each swap counts as one of "
                    "the N), or drop spares."]


def test_a_refused_restarts_is_said_once_not_again_for_spares():
    _, said = _read(spares=1, restarts="2")
    assert len(said) == 1 and said[0].startswith("@torchrun(restarts='2'): a whole number"), said


@pytest.mark.parametrize("spares,num_parallel", [(2, 2), (3, 2), (1, 1)])
def test_spares_must_leave_a_node_that_trains(spares, num_parallel):
    _, said = _read(entries=[str(num_parallel)], spares=spares, restarts=1)
    assert said == ["@torchrun(spares=%d) with num_parallel=%d: the gang trains on num_parallel - spares nodes, "
                    "which leaves none. Enter the step with num_parallel=N+%d for N nodes that train, or give "
                    "fewer spares." % (spares, num_parallel, spares)]


def test_each_entry_of_the_step_is_checked_and_a_variable_is_left_to_the_tasks_start():
    # Two steps enter this one: the smaller count is the one that leaves no node.
    (said,) = _read(entries=["4", "2"], spares=2, restarts=1)[1]
    assert "num_parallel=2" in said
    # A variable (Metaflow's graph keeps None; older ones the source text): unknown here.
    for entries in (["None"], ["self.nodes"], [""], ["True"]):
        assert _read(entries=entries, spares=2, restarts=1)[1] == [], entries
    # ... and checked on the real count when the task starts.
    with pytest.raises(TorchrunInvalidArgument, match=r"spares=2\) with num_parallel=2: "):
        check_spares_fit(2, 2)
    check_spares_fit(1, 2)
    check_spares_fit(0, 1)


def test_every_problem_of_the_step_is_said_at_once():
    _, said = _read(spares=True, restarts=1, hang_timeout=0.5)
    assert len(said) == 2 and any("hang_timeout" in s for s in said) and any("spares=True" in s for s in said)


def test_spares_reach_the_step_defaults_the_runtime_reads():
    spec, said = _read(entries=["3"], spares=1, restarts=2)
    assert said == [] and spec.spares == 1
    defaults = step_defaults(spec)
    assert (defaults.spares, defaults.restarts) == (1, 2)
    assert step_defaults(_read()[0]).spares == 0 == StepDefaults().spares


def test_spares_is_documented_on_the_decorator():
    from metaflow_extensions.torchrun.plugins.torchrun.decorator import TorchrunDecorator

    assert TorchrunDecorator.defaults["spares"] == 0
    assert "spares : int, default 0" in (TorchrunDecorator.__doc__ or "")
