"""``current.torch.torchrun_args``: metaflow-torchrun 0.2's five values for code
that builds its own torchrun command (e.g. TorchTune's plugin), this node's, fixed
at the step's first read; the port is the command's own (``ports.own_command_port``).
"""

from __future__ import annotations

import socket
import weakref
from typing import Any, Dict, NoReturn

from ..errors import TorchrunException
from ..gang.ports import own_command_port
from ..launch import merged_options
from ..launch.plan import resolve_nproc
from ..launch.resources import count_for_keyword
from .session import GangSession, bind_host

READ_ONLY = (
    "current.torch.torchrun_args is read-only: it says what @torchrun's own torchrun command uses, "
    "and changing it would change nothing. For a command of your own, change a copy "
    "(dict(current.torch.torchrun_args)); for current.torch.run, pass torchrun_args=... to it."
)

_fixed: "weakref.WeakKeyDictionary[GangSession, TorchrunArgs]" = weakref.WeakKeyDictionary()


class TorchrunArgs(dict):
    """A dict that refuses changes with a sentence instead of ignoring them: in
    0.2, writing into it changed the next ``run()``; here ``run()`` never reads it."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TorchrunException(READ_ONLY)

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = clear = setdefault = _refuse

    def copy(self) -> Dict[str, Any]:
        return dict(self)

    def __reduce__(self) -> Any:  # copy.copy, deepcopy and pickle give a plain dict
        return (dict, (dict(self),))


def torchrun_args_of(session: GangSession) -> TorchrunArgs:
    """This node's values, fixed at the first read of the step."""
    args = _fixed.get(session)
    if args is None:
        args = _fixed[session] = _values(session)
    return args


def _values(session: GangSession) -> TorchrunArgs:
    topology, defaults = session.context.topology, session.context.defaults
    nproc = resolve_nproc(None, merged_options(defaults, None), defaults)
    if not isinstance(nproc, int):
        nproc = count_for_keyword(nproc)[0]
    pinned = defaults.rdzv_port
    port = pinned if pinned is not None else own_command_port(session.context.identity.gang_id)
    if session.context.is_control and pinned is None:
        _require_free(bind_host(topology), port)
    return TorchrunArgs(nnodes=topology.num_nodes, master_addr=topology.main_addr, master_port=port,
                        node_rank=topology.node_index, nproc_per_node=nproc)


def _require_free(host: str, port: int) -> None:
    """On the control, where the user's torchrun hosts its store: a port taken
    fails the step here, saying what to do, not in their command."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise TorchrunException(
                "current.torch.torchrun_args: its master_port %d is in use on the control node (%s): "
                "pin a free one for the step with @torchrun(rdzv_port=N)." % (port, e.strerror or e)
            ) from None
