"""The step's code inside the step's gang: join as it starts (a refused attempt too,
to say why), leave saying how it ended; ``attempt_facts``: what the record needs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..card import this_card_hash
from ..errors import TorchrunNotRetried, drop_own_frame
from ..base.knobs import Knobs
from ..launch.node_checks import default_nproc
from ..record import AttemptFacts, ThisAttempt, attempts as attempts_
from . import preflight
from .session import GangSession


def in_gang(step_func: Callable[[], Any], start_session: Callable[[Any], GangSession],
            attempt: ThisAttempt, withdraw: Callable[[], None]) -> Callable[[], None]:
    """``step_func`` in the node's session; ``withdraw`` takes the control's secret back."""

    def step() -> None:
        from metaflow import current

        # @checkpoint (above @torchrun) has loaded by now.
        attempt.resumed_from = attempts_.checkpoint_info(current)
        attempt.code_started = time.time()
        session = start_session(current.parallel)
        preflight.attach(session, attempt.history)
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


def attempt_facts(session: Optional[GangSession]) -> Optional[AttemptFacts]:
    """What the step's record needs of the gang, as the task ends (None: the step's code never ran)."""
    if session is None:
        return None
    server, mode, defaults = session.server, session.preflight.mode, session.defaults
    return AttemptFacts(session.is_control, session.topology.node_index, session.topology.num_nodes,
                        results=tuple(session.results), cause=session.cause,
                        preflight=server.preflight_record(mode) if server is not None and mode else None,
                        job=session.preflight.job, hosts=server.hosts() if server is not None else None,
                        taken_out=tuple(session.bench.out), card=this_card_hash(),
                        nproc=default_nproc(defaults.nproc_per_node, defaults.derived_nproc),
                        main_addr=session.topology.main_addr)


def read_node_history(attempt: ThisAttempt, is_control: bool, flow_name: str, run_id: str, step_name: str,
                      preflight_mode: str, knobs: Knobs) -> Any:
    """On the control, the node history read in the background for the preflight's check of the hosts."""
    if not is_control or preflight_mode == "off":
        return None
    return preflight.History(flow_name, run_id, step_name, attempt.previous, knobs)
