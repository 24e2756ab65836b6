"""The rendezvous store's host outlives every agent that still talks to it.

torchrun's agents end a successful job with an exit barrier on the rendezvous
store, which one of them hosts in its own process (node 0 of the static
rendezvous, the ``is_host`` node of c10d's). The barrier's last arrival
releases every waiter at once, and the host's agent exits at once
(``agent.exit_now``), its store with it. Another agent whose wait was still
on its way, or c10d's close of the rendezvous that follows the barrier, then
finds the connection closed: torch's C++ prints ``recvValueWithTimeout
failed`` and a screen of frames after the run said it succeeded (issue 52).

So once its job is done, every other agent says on the store that it is done
with it (one ``add``, whose answer it waits for), and the host's agent waits
until all of them have: the last guest has had its answer before the store
goes. A guest that never says so (killed after the barrier) fails its own node,
and the gang stops the host's; ``wait`` only bounds what nothing else ends.

Runs in the agent process; imports torch only where it patches it.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Tuple

# The key every guest adds one to, under the agent store's own prefix (the
# call's rendezvous id): one counter per call, on a store no other call shares.
DONE_KEY = "metaflow-torchrun/agents-done"
# How often the host looks at the count: one round trip to its own store.
POLL = 0.01

# (store, agents) as torch's exit barrier saw them, once it ran in this process.
_SEEN: List[Tuple[Any, int]] = []


def watch_exit_barrier(agent_class: Any = None) -> bool:
    """Note the store and the number of agents when torch's exit barrier runs
    (``SimpleElasticAgent._exit_barrier``: reached only when this node's ranks
    all succeeded). Wrapped once; False where this torch has no such method."""
    if agent_class is None:
        try:
            from torch.distributed.elastic.agent.server import api
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
    """After the job: a guest says it is done with the store; the host waits
    until every guest has, at most ``wait`` seconds. None where no exit
    barrier ran here (nothing to do); False where the store failed or the
    guests did not all come within ``wait``. Never raises for the store: the
    job has succeeded, and torch's own words about a store gone wrong are in
    the agent's log."""
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
    """Until ``guests`` agents have added themselves to ``DONE_KEY``. Short
    sleeps between looks, so a SIGTERM (the gang stopping this node) is
    handled at once; ``wait`` bounds it."""
    deadline = time.monotonic() + wait
    while store.add(DONE_KEY, 0) < guests:
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True
