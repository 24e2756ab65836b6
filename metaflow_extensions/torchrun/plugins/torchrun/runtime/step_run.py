"""The step's code, run inside the step's gang.

The node joins as the step's code starts (Metaflow has set
``current.parallel`` by then, on every platform) and leaves, saying how the
step ended, as it ends. An attempt that ``retry_on`` refused joins too, so the
gang hears why before the step fails.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import TorchrunNotRetried, drop_own_frame
from . import attempts as attempts_
from . import preflight
from .session import GangSession
from .step_record import ThisAttempt


def in_gang(step_func: Callable[[], Any], start_session: Callable[[Any], GangSession],
            attempt: ThisAttempt, withdraw: Callable[[], None]) -> Callable[[], None]:
    """``step_func`` wrapped: ``start_session(current.parallel)`` makes the
    node's session; ``withdraw`` takes the control's secret back once every
    node has joined or never will."""

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
