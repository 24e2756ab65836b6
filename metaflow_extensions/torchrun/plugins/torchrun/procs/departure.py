"""The rendezvous store's host outlives every agent that still talks to it: past
torch's exit barrier an agent still talking to a gone store printed a screen of
C++ frames after a run that succeeded (issue 52).
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Tuple

# Under the agent store's prefix (the call's rendezvous id): one counter per call.
DONE_KEY = "metaflow-torchrun/agents-done"
POLL = 0.01

# (store, agents) as torch's exit barrier saw them, once it ran in this process.
_SEEN: List[Tuple[Any, int]] = []


def watch_exit_barrier(agent_class: Any = None) -> bool:
    """Note the store and the agents at torch's exit barrier (reached only when
    this node's ranks all succeeded). False where this torch has no such method."""
    if agent_class is None:
        try:
            from torch.distributed.elastic.agent.server import api  # torch only in torchrun's agent
        except ImportError:
            return False
        agent_class = api.SimpleElasticAgent
    original = getattr(agent_class, "_exit_barrier", None)
    if original is None or getattr(original, "_torchrun_watched", False):
        return False

    def _exit_barrier(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            group = getattr(self, "_worker_group", None)
            store, agents = getattr(self, "_store", None), getattr(group, "group_world_size", None)
            if store is not None and isinstance(agents, int):
                _SEEN[:] = [(store, agents)]

    _exit_barrier._torchrun_watched = True  # type: ignore[attr-defined]
    agent_class._exit_barrier = _exit_barrier
    return True


def depart(hosts: bool, wait: float) -> Optional[bool]:
    """None where no exit barrier ran here; False where the store failed or the
    guests did not all come in time. Never raises: the job has succeeded."""
    if not _SEEN:
        return None
    store, agents = _SEEN[0]
    try:
        if not hosts:
            store.add(DONE_KEY, 1)
            return True
        return wait_for_guests(store, agents - 1, wait)
    except Exception:
        return False


def wait_for_guests(store: Any, guests: int, wait: float) -> bool:
    """Short sleeps, so a SIGTERM (the gang stopping this node) is handled at once."""
    deadline = time.monotonic() + wait
    while store.add(DONE_KEY, 0) < guests:
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True
