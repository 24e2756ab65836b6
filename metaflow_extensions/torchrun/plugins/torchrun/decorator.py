"""``@torchrun``: Metaflow's hooks only. The work happens elsewhere: ``plan``
(what a call launches), ``session`` (the step's gang), ``call`` (one call).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from typing import Any, Dict, Optional

from . import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow.plugins.parallel_decorator import ParallelDecorator
from metaflow.unbounded_foreach import UBF_CONTROL

from .runtime import attach_card, card_ready, finish_card, refresh_live, render_card_now, skip_render
from .compat import (
    decorator_init_kwargs,
    card_commands,
    is_task_process,
    legacy_notes,
    local_control_task_id,
    meta_datum,
    translate_attributes,
)
from . import defaults as DEFAULTS
from .errors import Problems, TorchrunException, TorchrunInvalidArgument, TorchrunNotRetried, did_you_mean
from .gang import secret as gang_secret
from .handle import TorchrunHandle
from .gang import GangIdentity
from .lint import register_lint_check, require_parallel_entry
from .host import say
from .settings import export_knobs, knob_environ
from .runtime import stop_local_nodes, worker_python_problem
from .launch import (
    StepDefaults,
    check_options,
    legacy_rdzv_port,
    merged_options,
    none_note,
    option_names,
    step_timeout,
    validate_hang_timeout,
    validate_nproc,
    validate_shutdown_grace,
    validate_timeouts,
)
from .gang import LOCAL_PORT_ENV, find_free_port, parse_port
from .launch import none_keys
from .launch import validate_args_as
from .launch import check_port_clash, refuse_one_node_on_kubernetes, refuse_step_functions
from .launch import NO_ACCELERATORS
from .launch import requested_accelerators, small_shm_warning
from .runtime import attempts as attempts_
from .runtime import METADATA_FIELD, REPORT_ARTIFACT, TorchrunResult
from .runtime import GangSession
from .runtime import preflight as preflight_runtime
from .gang import DEFAULT_MODE as DEFAULT_PREFLIGHT
from .gang import parse_mode as parse_preflight
from .gang import CONTROL_TASK_ID_ENV, is_local_runtime, topology_from


# size: Metaflow's hook surface, one method per hook, each delegating; 70 of its lines are the docstring
# Metaflow shows as the decorator's documentation and reads for its stubs (Parameters, MF Add To Current).
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
        (all-reduce, bandwidth per node); ``False`` checks nothing.
    args_as : str, optional, default None
        ``"0.2"``: spell a dict of entrypoint_args as metaflow-torchrun 0.2 did
        (``True`` -> ``--k true``, ``[1, 2]`` -> ``--k "[1, 2]"``). Off by default.
    retry_on : str, default "any"
        Which failures of the previous attempt a ``@retry`` attempt runs after:
        ``"any"`` (Metaflow's @retry as it is) or ``"infrastructure"``: not after
        a Python exception of the user's code (in a rank or in the step), which
        would only raise again; the attempt fails at once, before any rank starts.

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

        @@ Returns
        -------
        TorchrunHandle
            The handle whose ``run`` starts one distributed call.
    """

    name = "torchrun"
    defaults: Dict[str, Any] = {
        "nproc_per_node": None,
        "torchrun_args": None,
        "port": None,
        "heartbeat_timeout": DEFAULTS.HEARTBEAT_TIMEOUT,
        "start_timeout": DEFAULTS.START_TIMEOUT,
        "label_logs": DEFAULTS.LABEL_LOGS,
        "card": DEFAULTS.CARD,
        "hang_timeout": DEFAULTS.HANG_TIMEOUT,
        "shutdown_grace": DEFAULTS.SHUTDOWN_GRACE,
        "rdzv_port": None,
        "args_as": None,
        "preflight": DEFAULT_PREFLIGHT,
        "retry_on": None,
    }
    IS_PARALLEL = True

    def __init__(self, attributes=None, statically_defined=False, inserted_by=None):
        # Metaflow raises on an unknown attribute while the flow file is being
        # imported, as a traceback; keep it and refuse cleanly at flow start.
        self._legacy = translate_attributes(attributes)  # metaflow-torchrun 0.2 names
        attributes = self._legacy.attributes
        self._unknown = sorted(k for k in attributes if k not in self.defaults)
        for k in self._unknown:
            attributes.pop(k)
        # `card view <run>/<step>` shows the control's card, and without a browser
        # says where it is (Metaflow has finished importing itself by the time a
        # flow's decorators are made).
        card_commands(sys.argv)
        # inserted_by exists from Metaflow 2.16 on.
        super().__init__(attributes, statically_defined, **decorator_init_kwargs(ParallelDecorator.__init__, inserted_by))

    def step_init(
        self, flow, graph, step_name, decorators, environment, flow_datastore, logger
    ):
        super().step_init(
            flow, graph, step_name, decorators, environment, flow_datastore, logger
        )
        problems = Problems()  # one run, every problem
        problems.check(legacy_notes, self._legacy, say, sys.argv)
        if self._unknown:
            problems.add(_unknown_message(self._unknown, self.defaults))
        problems.check(require_parallel_entry, graph, step_name)
        nproc = self.attributes.get("nproc_per_node")
        if nproc is not None:
            problems.check(validate_nproc, nproc, "@torchrun(nproc_per_node)")
        self._torchrun_args, legacy_port = self.attributes.get("torchrun_args"), None
        if self._torchrun_args is not None:
            options = problems.check(merged_options, StepDefaults(torchrun_args=self._torchrun_args), None)
            pinned = problems.check(legacy_rdzv_port, options, "@torchrun(torchrun_args)") if options else None
            if pinned is not None:
                legacy_port, notes = pinned
                if none_keys(self._torchrun_args):
                    notes = notes + [none_note(none_keys(self._torchrun_args), "@torchrun(torchrun_args)")]
                if not is_task_process(sys.argv):
                    for line in notes:
                        say(line)
                self._torchrun_args = options  # 0.2's spellings translated, said once here
            # Names torchrun does not know, also where a value was refused.
            problems.check(check_options, options if options is not None else option_names(self._torchrun_args))
        specs = [(deco.name, deco.attributes) for deco in decorators]
        self._accelerators = problems.check(requested_accelerators, specs) or NO_ACCELERATORS
        self._port = problems.check(parse_port, self.attributes.get("port"), "@torchrun(port)")
        self._rdzv_port = problems.check(self._pinned_rdzv_port, legacy_port)
        source = "@torchrun(rdzv_port)" if self.attributes.get("rdzv_port") is not None else "master_port"
        problems.check(check_port_clash, specs, self._port, self._rdzv_port, source)
        problems.check(refuse_step_functions, sys.argv)
        entries = [str(getattr(graph[p], "num_parallel", "")) for p in graph[step_name].in_funcs]
        problems.check(refuse_one_node_on_kubernetes, specs, entries)
        problems.check(validate_timeouts, self.attributes.get("heartbeat_timeout"), self.attributes.get("start_timeout"))
        self._hang_timeout = problems.check(validate_hang_timeout, self.attributes.get("hang_timeout"))
        self._shutdown_grace = problems.check(
            validate_shutdown_grace, self.attributes.get("shutdown_grace"), step_timeout(specs))
        self._args_as = problems.check(validate_args_as, self.attributes.get("args_as"), "@torchrun(args_as)")
        self._preflight = problems.check(_preflight_mode, self.attributes.get("preflight"))
        self._retry_on = problems.check(attempts_.validate_retry_on, self.attributes.get("retry_on"))
        problems.raise_all()
        self._card = attach_card(decorators) if _truthy(self.attributes["card"]) else None
        warning = small_shm_warning(specs, self._accelerators, nproc)
        if warning:
            say(warning)
        self._flow_name = flow.name
        self._flow_dir = os.path.dirname(os.path.abspath(sys.argv[0]))
        self._session: Optional[GangSession] = None
        self._secret: Any = None
        # The control's secret in the datastore, withdrawn when its step ends.
        self._published = gang_secret.Published(None)

    def runtime_step_cli(self, cli_args, retry_count, max_user_code_retries, ubf_context):
        super().runtime_step_cli(cli_args, retry_count, max_user_code_retries, ubf_context)
        env = getattr(cli_args, "env", None)
        if ubf_context == UBF_CONTROL and is_local_runtime(os.environ) and isinstance(env, dict):
            # Metaflow sets this on the local control only inside the step's
            # code, after every task_pre_step: @checkpoint reads it there, and
            # without it the control took an identity of its own while the
            # other nodes took the gang's (two checkpoint lineages per gang).
            # Kubernetes and Batch set it on every node from the start.
            env[CONTROL_TASK_ID_ENV] = str(cli_args.task.task_id)

    def _pinned_rdzv_port(self, legacy_port: Optional[int]) -> Optional[int]:
        """``rdzv_port``, or 0.2's ``master_port`` in ``torchrun_args``; never
        the gang service's own port."""
        port = parse_port(self.attributes.get("rdzv_port"), "@torchrun(rdzv_port)")
        if legacy_port is not None and port is not None and legacy_port != port:
            raise TorchrunInvalidArgument(
                "@torchrun(rdzv_port=%d) and torchrun_args master_port=%d: both pin torchrun's "
                "rendezvous port; give only rdzv_port." % (port, legacy_port))
        port = port if port is not None else legacy_port
        if port is not None and port == self._port:
            raise TorchrunInvalidArgument(
                "@torchrun(port=%d, rdzv_port=%d): the gang service and torchrun's rendezvous "
                "both listen on the control node and need two ports." % (port, port))
        return port

    def task_pre_step(
        self, step_name, task_datastore, metadata, run_id, task_id, flow, graph,
        retry_count, max_user_code_retries, ubf_context, inputs,
    ):
        super().task_pre_step(
            step_name, task_datastore, metadata, run_id, task_id, flow, graph,
            retry_count, max_user_code_retries, ubf_context, inputs,
        )
        from metaflow import current

        # The METAFLOW_TORCHRUN_* knobs a Metaflow profile sets, for every reader below.
        export_knobs()
        is_control = ubf_context == UBF_CONTROL
        if not is_control and self._card is not None:
            # The card belongs to the control task, which sees the whole gang.
            # Rendering one on every other node would cost each a Metaflow
            # start-up on its critical path. The card decorator stays on the
            # list: Metaflow counted it at step_init and finalises current.card
            # only once every counted card has been through task_pre_step, so
            # taking it off would break every other card of the step (a user's
            # @card, @model's) on this node. Only its render is skipped.
            skip_render(self._card)
            self._card = None
        # Only the control task has the card, and `card view <step>` picks another
        # node's task: name the one that has it.
        self._card_hint = (
            card_view_command(sys.argv[0], run_id, step_name, task_id) if self._card is not None else None
        )
        if ubf_context == UBF_CONTROL and is_local_runtime(os.environ) and _local_nodes(flow) > 1:
            # Checked before Metaflow starts them, so the step fails now, not at start_timeout.
            problem = worker_python_problem(os.environ.get("PATH", os.defpath), sys.executable)
            if problem:
                raise TorchrunException(problem)
        if is_control and is_local_runtime(os.environ) and self._port is None:
            # Metaflow spawns the other local nodes from this process after this
            # hook: they inherit the port through the environment.
            os.environ[LOCAL_PORT_ENV] = str(find_free_port())
        control_task_id = os.environ.get(CONTROL_TASK_ID_ENV) or (task_id if is_control else None)
        self._identity = GangIdentity(
            flow_name=self._flow_name,
            run_id=str(run_id),
            step_name=step_name,
            control_task_id=str(control_task_id or local_control_task_id(task_id)),
            attempt=int(retry_count),
        )
        self._share_secret(task_datastore._storage_impl, is_control)
        self._defaults = self._step_defaults()
        self._metadata = (metadata, run_id, step_name, task_id)
        self._attempt_started = time.time()
        self._previous: Optional[attempts_.Previous] = None
        self._refusal: Optional[str] = None
        self._resumed_from: Optional[attempts_.Checkpoint] = None
        self._code_started: Optional[float] = None
        if is_control and int(retry_count) > 0:
            self._read_previous("%s/%s/%s/%s" % (self._flow_name, run_id, step_name, task_id), int(retry_count))
        self._handle = TorchrunHandle()
        current._update_env({"torch": self._handle})

    def _share_secret(self, storage, is_control: bool) -> None:
        """The control publishes the gang's secret before Metaflow spawns the
        local nodes, so that they find it at once; the others fetch it while
        joining."""
        env = knob_environ()
        if is_control:
            self._secret, self._published = gang_secret.control_secret(storage, self._identity, env)
            return
        start_timeout = float(self.attributes["start_timeout"])
        identity = self._identity
        self._secret = lambda: gang_secret.for_worker(storage, identity, env, start_timeout)

    def _step_defaults(self) -> StepDefaults:
        return StepDefaults(
            nproc_per_node=self.attributes.get("nproc_per_node"),
            torchrun_args=self._torchrun_args,
            port=self._port,
            rdzv_port=self._rdzv_port,
            args_as=self._args_as or DEFAULTS.ARGS_AS,
            derived_nproc=self._accelerators.nproc,
            heartbeat_timeout=float(self.attributes["heartbeat_timeout"]),
            label_logs=_truthy(self.attributes["label_logs"]),
            start_timeout=float(self.attributes["start_timeout"]),
            accelerators=self._accelerators,
            hang_timeout=self._hang_timeout,
            shutdown_grace=self._shutdown_grace,
            preflight=self._preflight or DEFAULT_PREFLIGHT,
        )

    def _read_previous(self, pathspec: str, attempt: int) -> None:
        """Attempt k-1's record: the attempts so far, and whether to run this one."""
        self._previous, note = attempts_.read_previous(pathspec, attempt - 1, METADATA_FIELD)
        if note:
            say(note)
        self._refusal = attempts_.refusal(self._retry_on, attempt, self._previous)

    def task_decorate(
        self, step_func, flow, graph, retry_count, max_user_code_retries, ubf_context
    ):
        decorated = super().task_decorate(
            self._gang_step(step_func), flow, graph, retry_count, max_user_code_retries, ubf_context
        )
        if not (ubf_context == UBF_CONTROL and is_local_runtime(os.environ)):
            return decorated

        def control_step():
            try:
                return decorated()
            except BaseException as e:
                self._published.withdraw()
                stop_local_nodes()
                _without_our_frame(e)
                raise

        return control_step

    def _gang_step(self, step_func):
        """The step's code, inside the step's gang: it joins as the code starts
        (Metaflow has set ``current.parallel`` by then, on every platform) and
        leaves, saying how the step ended, as it ends."""

        def step():
            from metaflow import current

            topology = topology_from(current.parallel, os.environ, self._identity.gang_id, self._port)
            # @checkpoint (above @torchrun) has loaded by now.
            self._resumed_from = attempts_.checkpoint_info(current)
            self._code_started = time.time()
            session = self._session = self._handle.session = GangSession(
                self._identity, self._defaults, topology, self._flow_dir, secret=self._secret
            )
            session.card_hint = getattr(self, "_card_hint", None)
            if self._card is not None and session.is_control:
                flow_name = self._flow_name
                session.live_card = lambda record: refresh_live(record, flow_name)
            preflight_runtime.attach(session)
            session.join()
            try:
                with session.user_code():
                    if self._refusal is not None:
                        say(self._refusal)
                        raise TorchrunNotRetried(self._refusal)
                    step_func()
            except BaseException as e:
                echo = session.step_failed(e)
                if echo is not None:
                    raise echo from None
                _without_our_frame(e)
                raise
            else:
                session.step_succeeded()
            finally:
                session.close()
                self._published.withdraw()  # every node has joined or never will
                session.say_where_logs_are()

        return step

    def task_post_step(self, step_name, flow, graph, retry_count, max_user_code_retries):
        super().task_post_step(step_name, flow, graph, retry_count, max_user_code_retries)
        self._record_result(flow, retry_count)

    def task_exception(
        self, exception, step_name, flow, graph, retry_count, max_user_code_retries
    ):
        handled = super().task_exception(
            exception, step_name, flow, graph, retry_count, max_user_code_retries
        )
        self._record_result(flow, retry_count)
        return handled

    def task_finished(
        self, step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries
    ):
        super().task_finished(
            step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries
        )
        if self._session is not None:
            self._session.close()
        self._published.withdraw()  # also when the step's code never ran
        card_exists = self._card is None or card_ready(self._card)  # None: rendered in _record_result
        if not is_task_ok and self._card is not None:
            card_exists = render_card_now(self._card, retry_count)
        said = self._session is not None and self._session.card_hint_said
        if getattr(self, "_card_hint", None) and card_exists and not said:
            say("this step's card: %s" % self._card_hint)

    def _record_result(self, flow: Any, retry_count: int) -> None:
        """Keep the run's record as task metadata: readable after the run with
        ``Task(...).metadata_dict["torchrun-result"]``, bounded in size. On the
        control, the full report of every call (every rank's stack and output
        tail) is the artifact ``torchrun_report`` when the record leaves any of
        it out, and the record holds every attempt of the step so far. The card
        is rendered here, in the task, rather than by Metaflow in a subprocess
        after it."""
        session = self._session
        result = session.last_result if session is not None else None
        if result is None and session is not None:
            result = preflight_runtime.refusal_result(session)  # refused before any call
        if session is not None and session.is_control:
            result = self._with_attempts(result, retry_count)
        if result is None or session is None:
            return
        result.preflight = preflight_runtime.record(session) or result.preflight
        _, run_id, step_name, task_id = self._metadata
        record = result.to_json("artifact %s of %s/%s/%s/%s" % (
            REPORT_ARTIFACT, self._flow_name, run_id, step_name, task_id))
        if session.is_control and (result.stacks or '"compacted": true' in record):
            setattr(flow, REPORT_ARTIFACT, [r.to_dict() for r in session.results])
        if self._card is not None and finish_card(
            self._card, result, self._flow_name, self._accelerators, retry_count
        ):
            self._card = None
        MetaDatum = meta_datum()  # its module moved within Metaflow 2.12.x

        metadata, run_id, step_name, task_id = self._metadata
        try:
            metadata.register_metadata(
                run_id,
                step_name,
                task_id,
                [
                    MetaDatum(
                        field=METADATA_FIELD,
                        value=record,
                        type=METADATA_FIELD,
                        tags=["attempt_id:%d" % retry_count],
                    )
                ],
            )
        except Exception as e:  # the record must never fail the step
            say("could not store the run's record: %s" % e)

    def _with_attempts(self, result: Optional[TorchrunResult], retry_count: int) -> TorchrunResult:
        """The control's record, with every attempt of the step so far. An
        attempt that failed before any call (or was refused) gets a record
        too: the next attempt reads why it stopped."""
        session = self._session
        assert session is not None
        refused_for = None
        if self._refusal is not None and self._previous is not None:
            cause = self._previous.cause  # carried: the next attempt refuses too
            refused_for = attempts_.previous_origin(self._previous, retry_count - 1)
        else:
            cause = (result.cause if result is not None else None) or session.cause
        if result is None:
            now = time.time()
            result = TorchrunResult(
                command=[], node_index=0, num_nodes=session.topology.num_nodes, nproc_per_node="",
                exit_code=None, started_at=self._attempt_started, ended_at=now, call=-1)
        result.cause = cause
        entry = attempts_.this_attempt(retry_count, self._attempt_started, session.results, cause,
                                       self._resumed_from, refused_for, self._code_started)
        past = attempts_.fill_missing(attempts_.history(self._previous), retry_count)
        result.attempts = attempts_.with_costs(past + [entry])
        return result


def _without_our_frame(error: BaseException) -> None:
    """A step's own exception, re-raised (bare ``raise``: no frame is added),
    without this wrapper's frame at its head: Metaflow prints the traceback of
    a step's exception, and ours in it is noise (issue 36)."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__ and tb.tb_next is not None:
        error.__traceback__ = tb.tb_next


def _local_nodes(flow: Any) -> int:
    """How many nodes the local control starts (itself included)."""
    return int(getattr(getattr(flow, "_parallel_ubf_iter", None), "num_parallel", 1) or 1)


def card_view_command(argv0: str, run_id: Any, step_name: str, task_id: Any) -> str:
    """The command that shows this task's @torchrun card (the control task's pathspec:
    `card view <step>` alone would pick another node's task, which has none)."""
    return "python %s card view %s/%s/%s --id torchrun" % (
        shlex.quote(os.path.basename(argv0) or "flow.py"), run_id, step_name, task_id)


def _preflight_mode(value: Any) -> str:
    try:
        return parse_preflight(value)
    except ValueError as e:
        raise TorchrunInvalidArgument(str(e)) from None

def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


def _unknown_message(unknown, defaults) -> str:
    parts = []
    for name in unknown:
        parts.append("%r%s" % (name, did_you_mean(name, defaults)))
    return "@torchrun does not take %s. It takes: %s." % (
        ", ".join(parts),
        ", ".join(defaults),
    )


register_lint_check()
