"""The exits of ranks that could not write their own.

A rank writes its status file at its start and again as it exits
(``bootstrap._status``). A rank ended by a signal never reaches the second
write: SIGTERM from its agent when the gang stops (a failure on another node, a
hang, a step told to stop), SIGKILL after the agent's grace, a segfault. Such a
rank used to show exit "unknown" with no duration. Its parent, torchrun's agent,
reaps it and so knows its exit status; ``agent.py`` hands that here the moment
torch has reaped its workers, and the status file is completed with it.

Runs in the agent process: no Metaflow, no torch.
"""

from __future__ import annotations

from typing import List, Mapping

from .status import read_statuses, write_status


def complete(directory: str, exits: Mapping[int, int], when: float) -> List[int]:
    """Give every rank status in ``directory`` whose pid is in ``exits`` (pid ->
    exit status as ``subprocess`` reports it: negative for a signal) and that
    has no exit of its own that exit, ended at ``when``. A status the rank
    wrote itself is never changed. Returns the ranks completed."""
    done: List[int] = []
    if not exits:
        return done
    for rank, status in sorted(read_statuses(directory).items()):
        if status.exit_code is not None or status.pid not in exits:
            continue
        if write_status(directory, status.ended(int(exits[status.pid]), when)):
            done.append(rank)
    return done
