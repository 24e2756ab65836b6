"""``@torchrun``: Metaflow's hooks only. The work happens elsewhere: ``spec`` (the step's
settings), ``runtime/context.py`` (the step as this node runs it, frozen), ``runtime/session.py``
(the step's gang), ``runtime/api.py`` (one call).

`import metaflow` imports this module in every Metaflow process, most of which never run a
@torchrun step: it imports only what is light at its top, and the layers a @torchrun step
enters (its spec, gang, launch, runtime, card) in one place, ``_load``, as a hook first needs them.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import time
from types import ModuleType
from typing import Any, Dict

from . import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.metaflow_current import current
from metaflow.plugins.parallel_decorator import ParallelDecorator
from metaflow.unbounded_foreach import UBF_CONTROL

from .base import defaults as DEFAULTS
from .compat import (card_commands, decorator_init_kwargs, is_task_process, legacy_notes, local_control_task_id,
                     task_step, translate_attributes)
from .errors import Problems, did_you_mean, drop_own_frame, print_as_written


def _load(name: str) -> ModuleType:
    """The one lazy boundary: ``name`` (a module of this package, e.g. ``"runtime.session"``) loaded
    at the first hook that needs it, in the process that runs that hook (Metaflow's runtime process
    loads only what ``runtime_step_cli`` asks for, a task what its step runs)."""
    return importlib.import_module("%s.%s" % (__package__, name))


class TorchrunDecorator(ParallelDecorator):
    """
    Run a PyTorch distributed program with ``torchrun`` on every node of a
    ``@parallel`` step: ``current.torch.run(entrypoint="train.py", ...)``.

    Parameters
    ----------
    nproc_per_node : int, optional, default None
        Processes per node; overrides what is derived from the step's resources.
    torchrun_args : dict or list, optional, default None
        Extra torchrun options, e.g. ``{"max_restarts": 2}``.
    port : int, optional, default None
        The control node's main port, where the gang service listens (default:
        chosen automatically; ``@kubernetes(port=...)`` on Kubernetes).
    rdzv_port : int, optional, default None
        torchrun's rendezvous port on the control node, for every call (default:
        picked free per call by the control and announced to the nodes).
        metaflow-torchrun 0.2's ``master_port`` pinned this port.
    heartbeat_timeout : float, default 30
        Seconds of silence after which a node counts as dead and the gang stops.
    start_timeout : float, default 600
        Seconds for all nodes to join before the gang stops, naming the missing.
    label_logs : bool, default True
        Prefix every output line of a rank with ``[rank<N>]: ``.
    card : bool, default True
        Add a card (id ``torchrun``) of the distributed run to the control task.
    hang_timeout : float, optional, default None
        Seconds without a line of output from any rank of the gang before the
        gang stops as hung, showing where every rank was. Off by default.
    shutdown_grace : float, default 30
        Seconds every node's ranks get to stop (save a checkpoint) when any
        node is told to stop (SIGTERM, Ctrl-C, ``@timeout``, a spot termination
        notice), before SIGKILL; at most the step's ``@timeout``, and a spot
        notice's time left.
    preflight : str or bool, default "versions"
        Before the first ``current.torch.run`` starts the user's ranks, check
        the gang: ``"versions"`` compares every node's software and checks
        each node's fitness (/dev/shm, disk, GPUs, network; no process, no
        wait); ``"full"`` also runs a short collective job on every rank
        (all-reduce, bandwidth per node); ``"strict"`` refuses a node whose
        host was blamed for recent failures (node history) instead of
        warning; ``False`` checks nothing.
    args_as : str, optional, default None
        ``"0.2"``: spell a dict of entrypoint_args as metaflow-torchrun 0.2 did
        (``True`` -> ``--k true``, ``[1, 2]`` -> ``--k "[1, 2]"``). Off by default.
    retry_on : str, default "any"
        Which failures of the previous attempt a ``@retry`` attempt runs after:
        ``"any"`` (Metaflow's @retry as it is) or ``"infrastructure"``: not after
        a Python exception of the user's code (in a rank or in the step), which
        would only raise again; the attempt fails at once, before any rank starts.
    restarts : int, default 0
        How many times a call's ranks are restarted on every node, in the same
        tasks, after a failure that left every node's task alive (a rank killed
        by a signal or out of memory, a NCCL/gloo error, ``hang_timeout``):
        rank 0 stays on node 0, ``TORCHELASTIC_RESTART_COUNT`` says which
        restart it is. Not after a Python exception in your code; a node
        preempted, or lost with no spare and no ``min_nodes``, ends the
        attempt (``@retry``). Not with ``max_restarts``.
    spares : int, default 0
        Hot spares: of the step's ``num_parallel`` nodes, the last ``spares``
        join the gang and wait while the others train. When an in-step
        restart is due and its cause is pinned to one node other than node 0,
        or a node's task is lost (a pod gone, a host pulled; not on AWS Batch),
        that node is taken out and a spare takes its place; the swap counts as
        one of ``restarts``, which must be 1 or more. Less than ``num_parallel``.
    min_nodes : int, optional, default None
        A node's task lost with no spare left: the gang goes on with the
        nodes that remain (``WORLD_SIZE`` smaller), down to ``min_nodes``;
        counts as one of ``restarts``. Not with ``@batch``. Default: the loss
        ends the attempt.
    regrow : bool, default True
        A lost node whose task the platform starts again rejoins as a spare;
        with ``min_nodes``, the gang grows back to its size in a restart once
        every node saved a snapshot (or at the next restart, without them).
    snapshots : bool or int, optional, default None
        In-memory snapshots of the ranks' training state
        (``metaflow_extensions.torchrun.snapshot``): a restart resumes at the
        newest step every rank saved, from the node's memory or a peer's,
        not from your checkpoint. On by default where ``restarts`` allows a
        restart; ``False`` turns them off. A number N: HF's and Lightning's
        Trainer save every N steps (default: as often as 5 % of a step's
        time allows).
    snapshot_memory : int or str, optional, default None
        Each node's memory for snapshots: MB, or a share of the host's
        available memory such as ``"10%"`` (default: a quarter of it).

    MF Add To Current
    -----------------
    torch -> metaflow_extensions.torchrun.plugins.torchrun.handle.TorchrunHandle
        The step's torchrun launcher, on every node of a ``@torchrun`` step.
        ``current.torch.run(entrypoint, entrypoint_args=None, nproc_per_node=None,
        torchrun_args=None) -> TorchrunResult`` runs a script path or a
        module-level function under torchrun on this node, with every other node
        of the step; it raises ``TorchrunFailed`` when a rank fails anywhere.
        ``current.torch.last_result`` is the latest call's ``TorchrunResult``.
        ``current.torch.torchrun_args`` is metaflow-torchrun 0.2's dict of this
        node's ``nnodes``, ``master_addr``, ``master_port``, ``node_rank`` and
        ``nproc_per_node``, for a torchrun command of your own.
        ``current.torch.role`` is this node's part with ``@torchrun(spares=K)``:
        ``"active"``, ``"spare"`` or ``"out"`` (taken out after a failure pinned to it).

        @@ Returns
        -------
        TorchrunHandle
            The handle whose ``run`` starts one distributed call.
    """

    name = "torchrun"
    defaults: Dict[str, Any] = dict(DEFAULTS.ATTRIBUTES)
    IS_PARALLEL = True

    def __init__(self, attributes=None, statically_defined=False, inserted_by=None):
        # Metaflow raises on an unknown attribute as a traceback: kept, and refused cleanly at flow start.
        self._legacy = translate_attributes(attributes)  # metaflow-torchrun 0.2 names
        attributes = self._legacy.attributes
        self._unknown = sorted(k for k in attributes if k not in self.defaults)
        for k in self._unknown:
            attributes.pop(k)
        card_commands(sys.argv)  # `card view <run>/<step>`: the control's card
        _load("lint").register_lint_check()  # not at `import metaflow`: a flow's lint runs after its decorators
        kwargs = decorator_init_kwargs(ParallelDecorator.__init__, inserted_by)
        super().__init__(attributes, statically_defined, **kwargs)

    def step_init(self, flow, graph, step_name, decorators, environment, flow_datastore, logger):
        super().step_init(flow, graph, step_name, decorators, environment, flow_datastore, logger)
        self._deferred: Any = None
        if task_step(sys.argv) not in (None, step_name):
            # A task of another step (Metaflow inits every step's decorators in every task): the runtime
            # checked this one, and none of its hooks runs here, so its layers stay unloaded.
            self._deferred = (flow, graph, step_name, decorators)
            return
        self._init_step(flow, graph, step_name, decorators)

    def _init_step(self, flow, graph, step_name, decorators):
        print_as_written()  # this process's errors (a refusal here, the step's failure) keep their asterisks
        spec, card, say = _load("spec"), _load("card.lifecycle"), _load("host.console").say
        problems = Problems()  # one run, every problem
        problems.check(legacy_notes, self._legacy, say, sys.argv)
        if self._unknown:
            problems.add(_unknown_message(self._unknown, self.defaults))
        problems.check(_load("lint").require_parallel_entry, graph, step_name)
        specs = [(deco.name, deco.attributes) for deco in decorators]
        entries = [str(getattr(graph[p], "num_parallel", "")) for p in graph[step_name].in_funcs]
        self._spec = spec.read_step_spec(self.attributes, specs, entries, sys.argv, problems)
        self._knobs, refused = spec.read_settings()  # the launcher's settings, and each task's own: read once
        problems.messages.extend(refused)
        problems.raise_all()
        # The JobSet: lost pods back, and it completes with the control's Job.
        self._ends_with_control = _load("kubernetes_spec").keep_lost_workers(step_name, specs, self._spec)
        if not is_task_process(sys.argv):
            for line in self._spec.notes:  # 0.2's spellings, said once, by the launcher
                say(line)
        # The gang's main port: the step's, else the setting's (a local control picks its own: task_pre_step).
        self._port = self._spec.port if self._spec.port is not None else self._knobs.port
        self._accelerators = self._spec.accelerators
        self._card = card.attach_card(decorators) if spec.truthy(self.attributes["card"]) else None
        warning = _load("launch.resources").small_shm_warning(specs, self._accelerators,
                                                              self.attributes.get("nproc_per_node"))
        if warning:
            say(warning)
        self._flow_name = flow.name
        self._flow_dir = os.path.dirname(os.path.abspath(sys.argv[0]))
        self._session: Any = None  # runtime/session.py's GangSession, once the step's code starts
        self._history: Any = None  # the node history, read in the background (the control's preflight)
        self._warm: Any = None  # a local control's warm process, started before its nodes
        self._nodes_stopping: Any = None
        self._secret: Any = None
        self._published = _load("gang.secret").Published(None)

    def runtime_step_cli(self, cli_args, retry_count, max_user_code_retries, ubf_context):
        super().runtime_step_cli(cli_args, retry_count, max_user_code_retries, ubf_context)
        if ubf_context == UBF_CONTROL and _local_runtime():
            warm = self._knobs.warm_start if getattr(self, "_spec", None) and self._spec.runs_here else None
            _load("runtime.in_runtime").name_local_control(getattr(cli_args, "env", None), cli_args.task.task_id, warm)

    def runtime_finished(self, exception):
        super().runtime_finished(exception)
        _load("runtime.warm_start").close_runtime_warm()

    def task_pre_step(self, step_name, task_datastore, metadata, run_id, task_id, flow, graph,
                      retry_count, max_user_code_retries, ubf_context, inputs):
        super().task_pre_step(step_name, task_datastore, metadata, run_id, task_id, flow, graph,
                              retry_count, max_user_code_retries, ubf_context, inputs)
        if getattr(self, "_deferred", None) is not None:  # never, unless a task's command line misled step_init
            self._init_step(*self._deferred)
            self._deferred = None
        self._metadata = (metadata, run_id, step_name, task_id)
        self._attempt = _load("record.step_record").ThisAttempt(int(retry_count), int(max_user_code_retries or 0))
        _load("host.log").configure(self._knobs.debug)  # the debug channel, if asked for
        is_control = ubf_context == UBF_CONTROL
        self._card = _load("card.lifecycle").card_of_task(self._card, is_control)
        pathspec = "%s/%s/%s/%s" % (self._flow_name, run_id, step_name, task_id)
        self._card_of = (self._card, pathspec)  # this attempt's card, named once it has its hash
        topology = _load("gang.topology")
        control_task_id = os.environ.get(topology.CONTROL_TASK_ID_ENV) or (task_id if is_control else None)
        self._identity = _load("gang.identity").GangIdentity(
            self._flow_name, str(run_id), step_name, str(control_task_id or local_control_task_id(task_id)),
            int(retry_count))
        self._storage = task_datastore._storage_impl
        self._secret, self._published = _load("gang.secret").for_task(
            task_datastore._storage_impl, self._identity, self._knobs.secret, is_control,
            float(self.attributes["start_timeout"]))
        # Off a local run, a node's task may start after the step ended (a pod re-created late).
        self._step_end = None if _local_runtime() else _load("gang.step_end").StepEnd(
            task_datastore._storage_impl, self._identity)
        self._defaults = _load("spec").step_defaults(self._spec, self._knobs)
        if is_control and _local_runtime():
            self._warm, self._port = _load("runtime.local_nodes").prepare_local_nodes(
                _local_nodes(flow), self._spec.port, self._defaults)
        if is_control and int(retry_count) > 0:
            note = self._attempt.read_previous(pathspec, self._spec.retry_on)
            if note:
                _load("host.console").say(note)
        self._history = _load("runtime.preflight").read_history(
            is_control, self._flow_name, str(run_id), step_name, self._attempt.previous, self._spec.preflight,
            self._knobs)
        current._update_env({"torch": _load("handle").TorchrunHandle(lambda: self._session)})

    def task_decorate(self, step_func, flow, graph, retry_count, max_user_code_retries, ubf_context):
        local_nodes = _load("runtime.local_nodes")
        decorated = local_nodes.own_start(super().task_decorate(  # a local control starts its nodes, sees them end
            _load("runtime.step_run").in_gang(step_func, self._start_session, self._attempt,
                                              lambda: self._published.withdraw(), self._step_end),
            flow, graph, retry_count, max_user_code_retries, ubf_context,
        ))
        if not (ubf_context == UBF_CONTROL and _local_runtime()):
            return decorated

        def control_step():
            try:
                return decorated()
            except BaseException as e:
                self._published.withdraw()
                missing = self._session.missing_nodes if self._session is not None else None
                self._nodes_stopping = local_nodes.stop_local_nodes(missing)  # joined in task_finished
                _log().debug("the step failed: %s", type(e).__name__)
                drop_own_frame(e, __file__)
                raise

        return control_step

    def _start_session(self, parallel: Any) -> Any:
        """The step's context, built where all of it is known (a local control's nodes learn their place
        only as it starts them), and the session on it: at the start of the step's code, once."""
        card = _load("card.lifecycle")
        topology = _load("gang.topology").topology_from(parallel, os.environ, self._identity.gang_id, self._port)
        inputs = _load("launch.inputs")  # num_parallel known now
        inputs.check_spares_fit(self._defaults.spares, topology.num_nodes)
        inputs.check_min_nodes_fit(self._defaults.min_nodes, self._defaults.spares, topology.num_nodes)
        refresh = None
        if self._card is not None and topology.is_control:  # the card, refreshed while the ranks report progress
            flow_name = self._flow_name
            refresh = lambda record: card.refresh_live(record, flow_name)  # noqa: E731
        context = _load("runtime.context")
        self._session = _load("runtime.session").GangSession(context.step_context(
            self._identity, self._defaults, topology, self._secret, flow_dir=self._flow_dir, warm=self._warm,
            card=context.CardHooks(card.card_view_command(sys.argv[0], *self._card_of), refresh),
            history=self._history))
        self._warm = None  # the session's now: closed with it
        return self._session

    def task_post_step(self, step_name, flow, graph, retry_count, max_user_code_retries):
        super().task_post_step(step_name, flow, graph, retry_count, max_user_code_retries)
        self._record_result(flow, retry_count)
        tasks = getattr(flow, "_control_mapper_tasks", None)
        if tasks:  # the control (after its record, which places each node's task by its index)
            self._kept_tasks = _load("runtime.step_run").kept_tasks(list(tasks), getattr(self, "_session", None))
            flow._control_mapper_tasks = list(self._kept_tasks.values())

    def task_exception(self, exception, step_name, flow, graph, retry_count, max_user_code_retries):
        _log().debug("Metaflow's task_exception reached us")  # after the decorators above ours (@checkpoint's end)
        handled = super().task_exception(exception, step_name, flow, graph, retry_count, max_user_code_retries)
        self._record_result(flow, retry_count)
        return handled

    def task_finished(self, step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries):
        began = time.monotonic()
        super().task_finished(step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries)
        card = _load("card.lifecycle")
        # The warm process alone: the step's code never ran.
        for ending in (getattr(self, "_session", None), getattr(self, "_warm", None)):
            if ending is not None:
                ending.close()
        self._published.withdraw()  # also when the step's code never ran
        kept = getattr(self, "_kept_tasks", None)
        if is_task_ok and kept and getattr(self, "_ends_with_control", False) and not _local_runtime():
            _load("runtime.step_run").wait_for_tasks_stored(
                self._storage, self._flow_name, {n: t for n, t in kept.items() if n}, int(retry_count),
                float(self.attributes["start_timeout"]))
        card_exists = self._card is None or card.card_ready(self._card)  # None: rendered in _record_result
        if not is_task_ok and self._card is not None:
            card_exists = card.render_card_now(self._card, retry_count)
        hint = card.card_view_command(sys.argv[0], *getattr(self, "_card_of", (None, "")))
        session = getattr(self, "_session", None)
        if hint and card_exists and not (session is not None and session.card_hint_said):
            line = "this step's card: %s" % hint
            if is_task_ok:
                _load("host.console").say(line)
            elif session is not None and session.ranks_ran:  # none for a step that never ran
                # Metaflow prints the step's error once this hook returns: the card's line comes after it.
                atexit.register(_load("host.console").say, line)
        if getattr(self, "_nodes_stopping", None) is not None:
            self._nodes_stopping.join()
        _log().debug("task_finished in %.3fs (the local nodes' tasks gone with it)", time.monotonic() - began)

    def _record_result(self, flow: Any, retry_count: int) -> None:
        """The record as task metadata and artifacts; the card rendered here, not in Metaflow's subprocess."""
        finish_card = _load("card.lifecycle").finish_card
        began, session = time.monotonic(), getattr(self, "_session", None)
        if getattr(self, "_attempt", None) is None:  # task_pre_step raised at its start: no attempt to record
            return
        tasks = tuple(str(t) for t in getattr(flow, "_control_mapper_tasks", None) or []) \
            if session is not None and session.context.is_control else ()
        if _load("record.step_record").keep_record(
                flow, _load("runtime.step_run").attempt_facts(session, tasks), self._attempt, self._metadata,
                self._flow_name,
                       lambda result: finish_card(self._card, result, self._flow_name, self._accelerators, retry_count)
                       if self._card is not None else False):
            self._card = None
        _log().debug("record and card written in %.3fs", time.monotonic() - began)


def _log() -> logging.Logger:
    """The debug channel's logger of this module (host/log.py), loaded by the first hook that logs."""
    return _load("host.log").get("decorator")


def _local_runtime() -> bool:
    """Metaflow's local runtime (the gang's own topology's word, without loading it)."""
    return os.environ.get("METAFLOW_RUNTIME_ENVIRONMENT", "local") == "local"


def _local_nodes(flow: Any) -> int:
    return int(getattr(getattr(flow, "_parallel_ubf_iter", None), "num_parallel", 1) or 1)


def _unknown_message(unknown, defaults) -> str:
    parts = ["%r%s" % (name, did_you_mean(name, defaults)) for name in unknown]
    return "@torchrun does not take %s. It takes: %s." % (", ".join(parts), ", ".join(defaults))
