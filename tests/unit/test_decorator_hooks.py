"""Every hook of ``@torchrun`` is safe after an earlier one raised (issue 52).

Metaflow calls ``task_exception`` and ``task_finished`` whatever raised before
them: ``task_pre_step`` half-way (the unactivated venv's refusal, raised in
``prepare_local_nodes``), ``task_decorate``, the step, ``task_post_step``. A
hook that then reads state an earlier hook never set fails with an
AttributeError, which Metaflow prints as an Internal error in place of the
user's message. Here the real hooks run in Metaflow's order, on the control
and on another node, with a failure injected at every line of every hook in
turn (a trace function raises there): what leaves the task must be that
failure (or the step's own exception), never another from our state.

The hooks run for real; what would start processes or reach a datastore
(the local nodes, the gang's secret, the node history, the gang itself) is
replaced by a stand-in that does nothing.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import metaflow  # noqa: F401  (must come before our modules)
import pytest
from metaflow.plugins import parallel_decorator
from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK

from metaflow_extensions.torchrun.plugins.torchrun import decorator as decorator_mod
# The decorator's hooks load these modules (decorator._load) when a step enters them.
from metaflow_extensions.torchrun.plugins.torchrun.runtime import local_nodes, preflight, step_run
from metaflow_extensions.torchrun.plugins.torchrun.decorator import TorchrunDecorator
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunException
from metaflow_extensions.torchrun.plugins.torchrun.gang import secret as secret_mod

STEP = "train"
# Every hook @torchrun overrides, and the code they run of their own.
HOOKS = ("step_init", "runtime_step_cli", "runtime_finished", "task_pre_step", "task_decorate",
         "control_step", "task_post_step", "task_exception", "task_finished", "_record_result")
FILE = decorator_mod.__file__


class Injected(RuntimeError):
    """The failure put at one line of one hook: any error a callee might raise."""


class UserError(ValueError):
    """What the step's own code raises."""


class Inject:
    """A trace function that raises ``Injected`` at the ``at``-th line run
    in ``hook`` (one of decorator.py's functions), once."""

    def __init__(self, hook: str, at: int):
        self.hook, self.at, self.seen, self.fired = hook, at, 0, False

    def __call__(self, frame, event, arg):
        if frame.f_code.co_name == self.hook and frame.f_code.co_filename == FILE and not self.fired:
            return self.line
        return None

    def line(self, frame, event, arg):
        if event == "line" and not self.fired:
            self.seen += 1
            if self.seen == self.at:
                self.fired = True
                raise Injected("%s, line %d of it" % (self.hook, self.at))
        return self.line


class _Graph(dict):
    pass


def _graph():
    graph = _Graph()
    graph["start"] = SimpleNamespace(name="start", parallel_foreach=True, num_parallel=2, type="linear", in_funcs=[])
    graph[STEP] = SimpleNamespace(name=STEP, type="linear", in_funcs=["start"], decorators=[])
    return graph


class _Flow:
    name = "HookFlow"
    _parallel_ubf_iter = SimpleNamespace(num_parallel=2)
    _control_mapper_tasks = ["HookFlow/1/train/2", "HookFlow/1/train/3"]


class _Stopping:
    def join(self):
        pass


class _Warm:
    def close(self):
        pass


@pytest.fixture
def stand_ins(monkeypatch):
    """No process, datastore or gang: the hooks' own code only."""
    monkeypatch.setenv("METAFLOW_TORCHRUN_WARM_START", "0")
    monkeypatch.delenv("METAFLOW_RUNTIME_ENVIRONMENT", raising=False)
    monkeypatch.delenv("MF_PARALLEL_CONTROL_TASK_ID", raising=False)
    monkeypatch.setattr(sys, "argv", [os.path.abspath("flow.py"), "step", STEP])
    monkeypatch.setattr(secret_mod, "for_task", lambda *a: (b"s" * 32, secret_mod.Published(None)))
    monkeypatch.setattr(local_nodes, "prepare_local_nodes", lambda *a: (_Warm(), 29999))
    monkeypatch.setattr(local_nodes, "stop_local_nodes", lambda *a: _Stopping())
    monkeypatch.setattr(preflight, "read_history", lambda *a: None)
    # The gang's wrapper: the step's own function, as it would raise.
    monkeypatch.setattr(step_run, "in_gang", lambda step_func, start, attempt, withdraw, step_end: step_func)
    # Metaflow's local control (or ours, where runtime/local_nodes has one) would
    # start the other nodes as processes.
    monkeypatch.setattr(parallel_decorator, "_local_multinode_control_task_step_func",
                        lambda flow, env, step_func, retry_count, paths: step_func())
    monkeypatch.setattr(local_nodes, "own_start", lambda decorated: decorated)
    for name in [k for k in os.environ if k.startswith("METAFLOW_TORCHRUN_") and k != "METAFLOW_TORCHRUN_WARM_START"]:
        monkeypatch.delenv(name)
    yield
    metaflow.current._update_env({"torch": None})


def _launcher(deco, graph):
    """The hooks `python flow.py run` calls, in its order."""
    deco.step_init(_Flow(), graph, STEP, [deco], SimpleNamespace(), None, lambda *a, **k: None)
    args = SimpleNamespace(env={}, command_options={},
                           task=SimpleNamespace(task_id="2", ubf_iter=SimpleNamespace(num_parallel=2)))
    deco.runtime_step_cli(args, 0, 0, UBF_CONTROL)
    deco.runtime_finished(None)


def _task(deco, graph, ubf, step_raises):
    """One task, as metaflow/task.py's run_step calls the hooks. Returns what
    left the task (None: it succeeded)."""
    flow = _Flow()
    metadata = SimpleNamespace(register_metadata=lambda *a, **k: None)
    deco.step_init(flow, graph, STEP, [deco], SimpleNamespace(), None, lambda *a, **k: None)

    def step():
        if step_raises:
            raise UserError("the step's own error")

    ok = False
    try:
        try:
            deco.task_pre_step(STEP, SimpleNamespace(_storage_impl=None), metadata, "1", "2", flow, graph,
                               0, 0, ubf, [])
            deco.task_decorate(step, flow, graph, 0, 0, ubf)()
            deco.task_post_step(STEP, flow, graph, 0, 0)
            ok = True
        except Exception as ex:
            if not deco.task_exception(ex, STEP, flow, graph, 0, 0):
                raise
        finally:
            deco.task_finished(STEP, flow, graph, ok, 0, 0)
    except Exception as e:
        return e
    return None


def _run(process, hook, at):
    """``process()`` with a failure at line ``at`` of ``hook``; whether it
    fired, and what left the process."""
    inject = Inject(hook, at)
    before = sys.gettrace()
    sys.settrace(inject)
    try:
        try:
            left = process()
        except Exception as e:
            left = e
    finally:
        sys.settrace(before)
    return inject.fired, left


def _sweep(process, expected_ok):
    """Every line of every hook in turn; returns how many points were tried."""
    tried = 0
    for hook in HOOKS:
        at = 1
        while True:
            fired, left = _run(process, hook, at)
            if not fired:
                break
            tried += 1
            assert left is None or isinstance(left, (Injected, UserError)), (
                "a failure at %s, line %d of it, left the task as %r" % (hook, at, left))
            at += 1
    if expected_ok:  # and with nothing injected, the task succeeds
        assert _run(process, "no hook", 1)[1] is None
    return tried


@pytest.mark.parametrize("ubf", [UBF_CONTROL, UBF_TASK], ids=["control", "other node"])
@pytest.mark.parametrize("step_raises", [False, True], ids=["step ok", "step raises"])
def test_a_failure_at_any_line_of_any_hook_leaves_the_task_as_itself(stand_ins, ubf, step_raises):
    graph = _graph()
    tried = _sweep(lambda: _task(TorchrunDecorator(), graph, ubf, step_raises), expected_ok=not step_raises)
    assert tried > 40  # the sweep reached into every hook a task runs


def test_a_failure_at_any_line_of_the_launchers_hooks_is_itself(stand_ins):
    graph = _graph()

    def launcher():
        _launcher(TorchrunDecorator(), graph)

    assert _sweep(launcher, expected_ok=True) >= 8


def test_the_unactivated_venv_refusal_leaves_the_task_as_itself(stand_ins, monkeypatch):
    """The user's report: task_pre_step raised the documented "Fix: activate the
    environment" at prepare_local_nodes, and task_exception then read
    ``self._attempt``, which was not set yet: an AttributeError, printed as an
    Internal error of 73 lines instead of the fix."""
    refusal = TorchrunException("the other local nodes cannot start ... Fix: activate the environment")

    def refuse(*args):
        raise refusal

    monkeypatch.setattr(local_nodes, "prepare_local_nodes", refuse)
    assert _task(TorchrunDecorator(), _graph(), UBF_CONTROL, step_raises=False) is refusal


def test_the_settings_the_decorator_hands_on_are_read_once_at_the_start(stand_ins, monkeypatch):
    """METAFLOW_TORCHRUN_PORT, _SECRET and _DEBUG (test_prepare.py's KNOBS has the
    others): read at step_init, and what the task's hooks hand the gang's port,
    its secret and the debug channel, with the environment changed since."""
    from metaflow_extensions.torchrun.plugins.torchrun.host import log

    seen = {}
    monkeypatch.setattr(secret_mod, "for_task", lambda storage, identity, own, *a: (
        seen.setdefault("secret", own), secret_mod.Published(None)))
    monkeypatch.setattr(log, "configure", lambda on: seen.setdefault("debug", on))
    for name, value in (("PORT", "29998"), ("SECRET", "k" * 32), ("DEBUG", "1")):
        monkeypatch.setenv("METAFLOW_TORCHRUN_" + name, value)
    deco, graph = TorchrunDecorator(), _graph()
    deco.step_init(_Flow(), graph, STEP, [deco], SimpleNamespace(), None, lambda *a, **k: None)
    for name in ("PORT", "SECRET", "DEBUG"):
        monkeypatch.setenv("METAFLOW_TORCHRUN_" + name, "not read again")
    deco.task_pre_step(STEP, SimpleNamespace(_storage_impl=None), SimpleNamespace(register_metadata=lambda *a, **k: None),
                       "1", "2", _Flow(), graph, 0, 0, UBF_TASK, [])
    assert seen == {"secret": b"k" * 32, "debug": True} and deco._port == 29998
