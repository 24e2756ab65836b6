"""``current.torch``: what the step's code calls."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .errors import TorchrunException
from .record.result import TorchrunResult  # `import metaflow` exports it too: loaded anyway

if TYPE_CHECKING:  # `import metaflow` exports this class: the layers below load at the step's first call
    from .launch import ArgSpec
    from .runtime.session import GangSession
    from .runtime.torchrun_args import TorchrunArgs


def _documented_run(
    self: Any,
    entrypoint: Union[str, "os.PathLike[str]", Callable[..., Any]],
    entrypoint_args: ArgSpec = None,
    nproc_per_node: Optional[Union[int, str]] = None,
    torchrun_args: ArgSpec = None,
) -> TorchrunResult:
    """``TorchrunHandle.run``'s signature, as users write the call."""
    raise NotImplementedError


class TorchrunHandle:
    """Published as ``current.torch`` on every node of a ``@torchrun`` step."""

    def __init__(self, session: Callable[[], Optional[GangSession]] = lambda: None) -> None:
        """``session``: the step's gang, once the step's code started it (the decorator's)."""
        self._session = session

    @property
    def session(self) -> Optional[GangSession]:
        return self._session()

    @property
    def last_result(self) -> Optional[TorchrunResult]:
        session = self.session
        return session.last_result if session is not None else None

    @property
    def torchrun_args(self) -> TorchrunArgs:
        """metaflow-torchrun 0.2's ``nnodes``, ``master_addr``, ``master_port``,
        ``node_rank`` and ``nproc_per_node`` for this node, for code that launches
        torchrun itself (docs/from-0.2.md says what such a launch gets and loses).
        Read-only; the same values for the whole step."""
        session = self.session
        if session is None:
            raise TorchrunException("current.torch.torchrun_args can only be read in the step's own code.")
        # The runtime loads at the step's first use, not at `import metaflow`.
        from .runtime.torchrun_args import torchrun_args_of

        return torchrun_args_of(session)

    @property
    def role(self) -> str:
        """This node's part in the gang with ``@torchrun(spares=K)``:
        ``"active"`` (it trains), ``"spare"`` (it waits to replace a node) or
        ``"out"`` (taken out after a failure pinned to it; it trains no more
        in this step). As the latest call said it, at that call's start and
        at each of its restarts; before the first call, the step's start's:
        the last K nodes are spares (fewer, after preflight benched a node).
        Always ``"active"`` without spares. Read-only."""
        session = self.session
        if session is None:
            raise TorchrunException("current.torch.role can only be read in the step's own code.")
        return session.bench.role(session.context.node_index)

    def run(self, /, *args: Any, **kwargs: Any) -> TorchrunResult:
        """Run ``entrypoint`` (a script path, or a module-level function) under
        torchrun on this node, with every other node of the step; return when all
        of this node's ranks succeeded, raise ``TorchrunFailed`` otherwise (for a
        function, the rank's original exception, caused by ``TorchrunFailed``).
        Every node must make the same calls in the same order. A call that
        cannot be made (a keyword run() does not take, no entrypoint) is one
        ``TorchrunCallRefused`` naming every problem, never a ``TypeError``."""
        session = self.session
        if session is None:
            raise TorchrunException("current.torch.run can only be called in the step's own code.")
        from .launch import call_request
        from .runtime import api  # the runtime loads at the step's first call, not at `import metaflow`

        return api.run(session, call_request(args, kwargs))

    # What help(), IDEs and Metaflow's stubs show (inspect.signature follows ``__wrapped__``; made at
    # ``import metaflow``, a Signature would cost it a tenth of a millisecond): the call as documented.
    run.__wrapped__ = _documented_run  # type: ignore[attr-defined]
