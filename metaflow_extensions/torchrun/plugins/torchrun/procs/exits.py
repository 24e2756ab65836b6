"""The exits of ranks that could not write their own (ended by a signal): the
agent, or the zygote, reaps them and completes their status files here.
"""

from __future__ import annotations

from typing import List, Mapping

from .status import read_statuses, write_status


def complete(directory: str, exits: Mapping[int, int], when: float) -> List[int]:
    """``exits``: pid -> status (negative for a signal). A rank's own exit is never changed."""
    done: List[int] = []
    if not exits:
        return done
    for rank, status in sorted(read_statuses(directory).items()):
        if status.exit_code is not None or status.pid not in exits:
            continue
        if write_status(directory, status.ended(int(exits[status.pid]), when)):
            done.append(rank)
    return done
