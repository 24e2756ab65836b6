"""The step's code inside the step's gang: join as it starts (a refused attempt too,
to say why), leave saying how it ended; ``attempt_facts``: what the record needs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from metaflow import current

from ..card import this_card_hash
from ..errors import TorchrunNotRetried, drop_own_frame
from ..launch.node_checks import default_nproc
from ..procs.relay import whole_line_prints
from ..record.step_record import AttemptFacts, ThisAttempt
from ..record import attempts as attempts_
from .session import GangSession


def in_gang(step_func: Callable[[], Any], start_session: Callable[[Any], GangSession],
            attempt: ThisAttempt, withdraw: Callable[[], None]) -> Callable[[], None]:
    """``step_func`` in the node's session; ``withdraw`` takes the control's secret back."""

    def step() -> None:
        whole_line_prints()  # the step's own print()s: a local run's nodes share one console
        attempt.code_starts(attempts_.checkpoint_info(current))  # @checkpoint (above @torchrun) has loaded by now
        session = start_session(current.parallel)
        session.join()
        try:
            with session.user_code():
                if attempt.refusal is not None:  # said once, as this error
                    raise TorchrunNotRetried(attempt.refusal)
                step_func()
        except BaseException as e:
            echo = session.step_failed(e)
            if echo is not None:
                raise echo from None
            drop_own_frame(e, __file__)
            raise
        else:
            session.step_succeeded()
        finally:
            session.close()
            withdraw()
            session.say_where_logs_are()

    return step


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
                        main_addr=session.context.topology.main_addr, tasks=tasks)
