"""The step's code inside the step's gang: join as it starts (a refused attempt too,
to say why), leave saying how it ended; ``attempt_facts``: what the record needs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from metaflow import current
from metaflow.datastore.task_datastore import TaskDataStore

from ..card import this_card_hash
from ..cause import CONTROL_GONE
from ..errors import TorchrunNotRetried, drop_own_frame
from ..gang.step_end import StepEnd
from ..host.console import say
from ..launch.node_checks import default_nproc
from ..procs.relay import whole_line_prints
from ..record.step_record import AttemptFacts, ThisAttempt
from ..record import attempts as attempts_
from .session import GangSession


def in_gang(step_func: Callable[[], Any], start_session: Callable[[Any], GangSession],
            attempt: ThisAttempt, withdraw: Callable[[], None],
            step_end: Optional[StepEnd] = None) -> Callable[[], None]:
    """``step_func`` in the node's session; ``withdraw`` takes the control's secret back. ``step_end``
    (off a local run): the control says its step ended fine; a node that starts after it ends at once."""

    def step() -> None:
        whole_line_prints()  # the step's own print()s: a local run's nodes share one console
        attempt.code_starts(attempts_.checkpoint_info(current))  # @checkpoint (above @torchrun) has loaded by now
        node = current.parallel.node_index
        if node != 0 and step_end is not None and step_end.ended():
            return say(late_words(node))  # a pod re-created after the step: no gang to join, nothing to do
        session = start_session(current.parallel)
        session.join()
        try:
            with session.user_code():
                if attempt.refusal is not None:  # said once, as this error
                    raise TorchrunNotRetried(attempt.refusal)
                step_func()
        except BaseException as e:
            if late_for_the_gang(session, step_end):
                return say(late_words(node))
            echo = session.step_failed(e)
            if echo is not None:
                raise echo from None
            drop_own_frame(e, __file__)
            raise
        else:
            session.step_succeeded()
            if session.context.is_control:
                if step_end is not None:
                    step_end.ended_fine()  # before the service closes: a node that finds it gone reads this
                say_not_back(session)
        finally:
            session.close()
            withdraw()
            session.say_where_logs_are()

    return step


def late_for_the_gang(session: GangSession, step_end: Optional[StepEnd]) -> bool:
    """A worker that found the control gone (or never reached it) because the control's step had
    already ended fine: it started, or came back, after the gang was done with it."""
    cause = session.cause
    return (not session.context.is_control and step_end is not None and cause is not None
            and cause.kind in CONTROL_GONE and step_end.ended())


def late_words(node: int) -> str:
    return ("node %d: the gang's step had already ended fine when this task started (the gang went on without "
            "this node after it was lost): there is nothing left for it to do, and it ends fine" % node)


def say_not_back(session: GangSession) -> None:
    """The control, as its step ends fine: the nodes lost that never came back, once."""
    client = session.client
    gone = client.not_back() if client is not None else []
    if gone:
        hosts = client.hosts() if client is not None else {}
        say("%s lost and not back within start_timeout (%gs) of the loss: the step ended without %s, and "
            "the join's inputs leave %s out" % (", ".join("node %d (%s)" % (n, hosts.get(n, "?")) for n in gone),
                                                session.config.start_timeout, "them" if len(gone) > 1 else "it",
                                                "them" if len(gone) > 1 else "it"))


def attempt_facts(session: Optional[GangSession], tasks: Tuple[str, ...] = ()) -> Optional[AttemptFacts]:
    """What the step's record needs of the gang, as the task ends (None: the step's code never ran).
    ``tasks``: every node's task, as Metaflow lists them on the control."""
    if session is None:
        return None
    defaults, client = session.context.defaults, session.client
    return AttemptFacts(session.context.is_control, session.context.node_index, session.context.topology.num_nodes,
                        results=tuple(session.results), cause=session.cause,
                        preflight=session.preflight_record(), job=session.preflight_job,
                        hosts=client.hosts() if client is not None and client.speaks_for_gang else None,
                        taken_out=tuple(session.bench.out), card=this_card_hash(),
                        nproc=default_nproc(defaults.nproc_per_node, defaults.derived_nproc),
                        main_addr=session.context.topology.main_addr, tasks=tasks,
                        not_back=tuple(client.not_back()) if client is not None and client.speaks_for_gang else ())


def kept_tasks(tasks: Sequence[str], session: Optional[GangSession]) -> Dict[int, str]:
    """The control's list of the step's tasks (Metaflow's ``_control_mapper_tasks``, node i at place i, from
    which the runtime builds the join's inputs), by node, without the nodes that never came back: their
    tasks never finished, and a join that waited for them would never run."""
    client = session.client if session is not None and session.context.is_control else None
    gone = set(client.not_back()) if client is not None else set()
    return {node: task for node, task in enumerate(tasks) if node not in gone}


# The control says it waits for the others' tasks once it has waited this long.
STORED_SAY_AFTER = 2.0
STORED_POLL = 0.5


def wait_for_tasks_stored(storage: Any, flow_name: str, tasks: Mapping[int, str], attempt: int, timeout: float,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], None] = time.sleep) -> List[int]:
    """The control on Kubernetes, as its task ends, where the step's JobSet completes with it (spares or
    min_nodes: launch/pod_loss.py): the JobSet then deletes the Jobs still running, so this task ends only
    once every other task it listed for the join (``tasks``: node -> run/step/task) has stored its
    artifacts (Metaflow's done marker of ``attempt``), ``timeout`` at most. Returns the nodes still not
    stored."""
    marker = TaskDataStore.metadata_name_for_attempt(TaskDataStore.METADATA_DONE_SUFFIX, attempt)
    paths = {node: storage.path_join(flow_name, task, marker) for node, task in sorted(tasks.items())}
    began, said = clock(), False
    while True:
        found = storage.is_file(list(paths.values())) if paths else []
        paths = {node: path for (node, path), ok in zip(list(paths.items()), found) if not ok}
        waited = clock() - began
        if not paths or waited >= timeout:
            break
        if not said and waited >= STORED_SAY_AFTER:
            said = True
            say("waiting for %s to store %s artifacts before this task ends (on Kubernetes the step's JobSet "
                "ends with this task), %gs at most" % (*_nodes_words(paths), timeout))
        sleep(STORED_POLL)
    if paths:
        words, their = _nodes_words(paths)
        say("%s had not stored %s artifacts after %gs: this task ends without waiting longer, and the join "
            "will not find %s" % (words, their, timeout, "it" if their == "its" else "them"))
    return sorted(paths)


def _nodes_words(nodes: Any) -> Tuple[str, str]:
    listed = sorted(nodes)
    if len(listed) == 1:
        return "node %d's task" % listed[0], "its"
    return "the tasks of nodes %s" % ", ".join(str(n) for n in listed), "their"
