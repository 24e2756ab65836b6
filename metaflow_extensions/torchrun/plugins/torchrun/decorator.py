"""``@torchrun``: Metaflow hooks only. The work happens in ``runner.py``."""

from __future__ import annotations

import difflib
import os
import signal
import sys
from typing import Any, Dict, Optional

from metaflow.plugins.parallel_decorator import ParallelDecorator
from metaflow.unbounded_foreach import UBF_CONTROL

from . import proctree
from .errors import TorchrunInvalidArgument
from .card import CARD_ID, build_components
from .resources import requested_accelerators
from .result import METADATA_FIELD
from .runner import (
    GangIdentity,
    StepDefaults,
    TorchrunHandle,
    check_options,
    merged_options,
    validate_nproc,
)
from .topology import (
    LOCAL_PORT_ENV,
    find_free_port,
    is_local_runtime,
    parse_port,
)


class TorchrunDecorator(ParallelDecorator):
    """
    Run a PyTorch distributed program with ``torchrun`` on every node of a
    ``@parallel`` step: ``current.torch.run(entrypoint="train.py", ...)``.

    Parameters
    ----------
    nproc_per_node : int, optional
        Processes per node; overrides what is derived from the step's resources.
    torchrun_args : dict or list, optional
        Extra torchrun options, e.g. ``{"max_restarts": 2}``.
    port : int, optional
        The control node's main port, where the gang service listens (default:
        chosen automatically; ``@kubernetes(port=...)`` on Kubernetes). torchrun's
        rendezvous port is picked free by the control and announced to the nodes.
    heartbeat_timeout : float, default 30
        Seconds of silence after which a node counts as dead and the gang stops.
    start_timeout : float, default 600
        Seconds for all nodes to join before the gang stops, naming the missing.
    label_logs : bool, default True
        Prefix every output line of a rank with ``[rank<N>]: ``.
    card : bool, default True
        Add a card (id ``torchrun``) of the distributed run to the control task.
    """

    name = "torchrun"
    defaults: Dict[str, Any] = {
        "nproc_per_node": None,
        "torchrun_args": None,
        "port": None,
        "heartbeat_timeout": 30,
        "start_timeout": 600,
        "label_logs": True,
        "card": True,
    }
    IS_PARALLEL = True

    def __init__(self, attributes=None, statically_defined=False, inserted_by=None):
        # Metaflow raises on an unknown attribute while the flow file is being
        # imported, as a traceback; keep it and refuse cleanly at flow start.
        attributes = dict(attributes or {})
        self._unknown = sorted(k for k in attributes if k not in self.defaults)
        for k in self._unknown:
            attributes.pop(k)
        super().__init__(attributes, statically_defined, inserted_by)

    def step_init(
        self, flow, graph, step_name, decorators, environment, flow_datastore, logger
    ):
        super().step_init(
            flow, graph, step_name, decorators, environment, flow_datastore, logger
        )
        if self._unknown:
            raise TorchrunInvalidArgument(_unknown_message(self._unknown, self.defaults))
        _require_parallel_entry(graph, step_name)
        nproc = self.attributes.get("nproc_per_node")
        if nproc is not None:
            validate_nproc(nproc, "@torchrun(nproc_per_node)")
        if self.attributes.get("torchrun_args") is not None:
            check_options(merged_options(StepDefaults(torchrun_args=self.attributes["torchrun_args"]), None))
        self._accelerators = requested_accelerators(
            (deco.name, deco.attributes) for deco in decorators
        )
        self._card = _attach_card(decorators) if _truthy(self.attributes["card"]) else None
        self._decorators = decorators
        _warn_small_shm(decorators, self._accelerators, nproc)
        self._port = parse_port(self.attributes.get("port"), "@torchrun(port)")
        for name in ("heartbeat_timeout", "start_timeout"):
            _positive_seconds(self.attributes.get(name), "@torchrun(%s)" % name)
        self._flow_name = flow.name
        self._flow_dir = os.path.dirname(os.path.abspath(sys.argv[0]))

    def task_pre_step(
        self,
        step_name,
        task_datastore,
        metadata,
        run_id,
        task_id,
        flow,
        graph,
        retry_count,
        max_user_code_retries,
        ubf_context,
        inputs,
    ):
        super().task_pre_step(
            step_name,
            task_datastore,
            metadata,
            run_id,
            task_id,
            flow,
            graph,
            retry_count,
            max_user_code_retries,
            ubf_context,
            inputs,
        )
        from metaflow import current

        if ubf_context != UBF_CONTROL and self._card is not None:
            # The card belongs to the control task, which sees the whole gang.
            # Rendering one on every other node costs each a Metaflow start-up
            # on its critical path. Metaflow is iterating this list and has not
            # reached the card yet: removing it skips all of its hooks.
            if self._card in self._decorators:
                self._decorators.remove(self._card)
            self._card = None
        if ubf_context == UBF_CONTROL and is_local_runtime(os.environ):
            # Metaflow spawns the other local nodes from this process after this
            # hook: they inherit the port through the environment.
            if self._port is None:
                os.environ[LOCAL_PORT_ENV] = str(find_free_port())
        control_task_id = os.environ.get("MF_PARALLEL_CONTROL_TASK_ID") or (
            task_id if ubf_context == UBF_CONTROL else None
        )
        identity = GangIdentity(
            flow_name=self._flow_name,
            run_id=str(run_id),
            step_name=step_name,
            control_task_id=str(control_task_id or _control_id_from(task_id)),
            attempt=int(retry_count),
        )
        defaults = StepDefaults(
            nproc_per_node=self.attributes.get("nproc_per_node"),
            torchrun_args=self.attributes.get("torchrun_args"),
            port=self._port,
            derived_nproc=self._accelerators.nproc,
            heartbeat_timeout=float(self.attributes["heartbeat_timeout"]),
            label_logs=_truthy(self.attributes["label_logs"]),
            start_timeout=float(self.attributes["start_timeout"]),
            accelerators=self._accelerators,
        )
        self._handle = TorchrunHandle(identity, defaults, lambda: current.parallel, self._flow_dir)
        self._metadata = (metadata, run_id, step_name, task_id)
        current._update_env({"torch": self._handle})

    def task_post_step(self, step_name, flow, graph, retry_count, max_user_code_retries):
        super().task_post_step(step_name, flow, graph, retry_count, max_user_code_retries)
        self._record_result(retry_count)

    def task_exception(
        self, exception, step_name, flow, graph, retry_count, max_user_code_retries
    ):
        handled = super().task_exception(
            exception, step_name, flow, graph, retry_count, max_user_code_retries
        )
        self._record_result(retry_count)
        return handled

    def task_finished(
        self, step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries
    ):
        super().task_finished(
            step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries
        )
        if not is_task_ok and self._card is not None:
            # Metaflow renders cards of successful tasks only; the card of a
            # failed run is the one that matters most.
            _render_card_now(self._card)

    def _record_result(self, retry_count: int) -> None:
        """Keep the run's record as task metadata: readable after the run with
        ``Task(...).metadata_dict["torchrun-result"]``."""
        result = getattr(getattr(self, "_handle", None), "last_result", None)
        if result is None:
            return
        if self._card is not None:
            _fill_card(result, self._flow_name)
        from metaflow.metadata_provider import MetaDatum

        metadata, run_id, step_name, task_id = self._metadata
        try:
            metadata.register_metadata(
                run_id,
                step_name,
                task_id,
                [
                    MetaDatum(
                        field=METADATA_FIELD,
                        value=result.to_json(),
                        type=METADATA_FIELD,
                        tags=["attempt_id:%d" % retry_count],
                    )
                ],
            )
        except Exception as e:  # the record must never fail the step
            print("@torchrun: could not store the run's record: %s" % e, file=sys.stderr)

    def task_decorate(
        self, step_func, flow, graph, retry_count, max_user_code_retries, ubf_context
    ):
        decorated = super().task_decorate(
            step_func, flow, graph, retry_count, max_user_code_retries, ubf_context
        )
        if not (ubf_context == UBF_CONTROL and is_local_runtime(os.environ)):
            return decorated

        def control_step():
            # Metaflow's local control task starts the other nodes as child
            # processes and only waits for them when its own step succeeds: if it
            # fails, we stop them so no node outlives the step.
            try:
                return decorated()
            except BaseException:
                _stop_local_nodes()
                raise

        return control_step


def _warn_small_shm(decorators, accelerators, nproc) -> None:
    """NCCL between processes of one node goes through /dev/shm, which containers
    get at 64 MiB unless the step asks for more; say so before the run, not as
    an NCCL error in the middle of it."""
    count = nproc if isinstance(nproc, int) else accelerators.nproc
    if accelerators.kind != "gpu" or not count or count < 2:
        return
    for deco in decorators:
        if deco.name in ("kubernetes", "batch") and not deco.attributes.get("shared_memory"):
            message = (
                "@torchrun: %d GPU processes per node share /dev/shm, which is 64 MiB in "
                "most containers; consider @%s(shared_memory=<MiB>) for NCCL."
                % (count, deco.name)
            )
            # stderr: some commands print machine-readable output on stdout
            # (`argo-workflows create --only-json`).
            print(message, file=sys.stderr)
            return


def _attach_card(decorators) -> Optional[Any]:
    """Add ``@card(type="blank", id="torchrun")`` to the step unless present."""
    try:
        from metaflow.plugins.cards.card_decorator import CardDecorator
    except ImportError:
        return None
    for deco in decorators:
        if isinstance(deco, CardDecorator) and deco.attributes.get("id") == CARD_ID:
            return deco
    deco = CardDecorator(attributes={"type": "blank", "id": CARD_ID})
    deco.external_init()
    # Metaflow is iterating this very list to call step_init: the card's own
    # step_init runs right after ours.
    decorators.append(deco)
    return deco


def _fill_card(result, flow_name: str) -> None:
    from metaflow import current

    try:
        card = current.card[CARD_ID]
        card.clear()
        cuda = any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0"))
        backend = "nccl" if cuda else "gloo (no CUDA device on the node)"
        card.extend(build_components(result, flow_name, current.pathspec, backend))
    except Exception as e:  # a card must never fail the step
        print("@torchrun: could not build the card: %s" % e, file=sys.stderr)


def _render_card_now(deco) -> None:
    try:
        deco.card_creator.create(
            mode="render",
            final=True,
            card_uuid=deco._card_uuid,
            user_set_card_id=deco._user_set_card_id,
            runtime_card=deco._is_runtime_card,
            decorator_attributes=deco.attributes,
            card_options=deco.card_options,
            logger=deco._logger,
            sync=True,
        )
    except Exception as e:
        print("@torchrun: could not render the card of the failed task: %s" % e, file=sys.stderr)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


def _positive_seconds(value: Any, source: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise TorchrunInvalidArgument("%s=%r is not a number of seconds." % (source, value)) from None
    if not seconds > 0:
        raise TorchrunInvalidArgument("%s=%r must be more than 0 seconds." % (source, value))
    return seconds


def _unknown_message(unknown, defaults) -> str:
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(defaults), n=1)
        parts.append("%r%s" % (name, " (did you mean %r?)" % close[0] if close else ""))
    return "@torchrun does not take %s. It takes: %s." % (
        ", ".join(parts),
        ", ".join(defaults),
    )


def _missing_num_parallel(graph, step_name: str) -> Optional[str]:
    node = graph[step_name]
    for parent in node.in_funcs:
        if not graph[parent].parallel_foreach:
            return (
                "step *%s* has @torchrun but step *%s* enters it without num_parallel. "
                "Write self.next(self.%s, num_parallel=N) to run it on N nodes "
                "(num_parallel=1 runs a single node with several processes)."
                % (step_name, parent, step_name)
            )
    return None


def _require_parallel_entry(graph, step_name: str) -> None:
    message = _missing_num_parallel(graph, step_name)
    if message:
        raise TorchrunInvalidArgument(message)


def _lint_torchrun_steps(graph) -> None:
    from metaflow.lint import LintWarn

    for node in graph:
        if not any(getattr(d, "name", None) == "torchrun" for d in node.decorators):
            continue
        try:
            message = _missing_num_parallel(graph, node.name)
        except KeyError:  # a broken graph: Metaflow's own checks report it
            continue
        if message:
            raise LintWarn(message, node.func_lineno, node.source_file)


def _register_lint_check() -> None:
    """Run our check before Metaflow's split/join balance check, whose message
    ("join not preceded by a split") hides the real mistake from the user."""
    try:
        from metaflow.lint import linter
    except ImportError:
        return
    checks = getattr(linter, "_checks", None)
    if not isinstance(checks, list) or _lint_torchrun_steps in checks:
        return
    linter.ensure_static_graph(linter.check(_lint_torchrun_steps))
    checks.remove(_lint_torchrun_steps)
    names = [getattr(c, "__name__", "") for c in checks]
    at = names.index("check_split_join_balance") if "check_split_join_balance" in names else len(checks)
    checks.insert(at, _lint_torchrun_steps)


_register_lint_check()


def _control_id_from(task_id: str) -> str:
    # Local worker task ids are "<control id>_node_<index>".
    return str(task_id).split("_node_")[0]


def _stop_local_nodes(settle: float = 3.0, grace: float = 3.0) -> None:
    """Give this task's node subprocesses ``settle`` seconds to finish on their own
    (the gang has told them to stop, and they are reporting why), then SIGTERM
    them (each stops its own torchrun), then SIGKILL what is left."""
    nodes = {
        proc
        for proc, cmdline in proctree.children(os.getpid())
        if "step" in cmdline and "ubf_task" in cmdline
    }
    nodes = proctree.wait_gone(nodes, settle)
    if not nodes:
        return
    proctree.signal_all(nodes, signal.SIGTERM)
    left = proctree.wait_gone(nodes, grace)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.wait_gone(left, 2)
