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

import json
import os
from typing import Any, Dict, List, Mapping

from .failures import PRIVATE_NEW
from .names import STATUS_SUFFIX, rank_of


def complete(directory: str, exits: Mapping[int, int], when: float) -> List[int]:
    """Give every rank status in ``directory`` whose pid is in ``exits`` (pid ->
    exit status as ``subprocess`` reports it: negative for a signal) and that
    has no exit of its own that exit, ended at ``when``. A status the rank
    wrote itself is never changed. Returns the ranks completed."""
    done: List[int] = []
    if not exits:
        return done
    try:
        names = os.listdir(directory)
    except OSError:
        return done
    for name in sorted(names):
        rank = rank_of(name, STATUS_SUFFIX)
        if rank is None:
            continue
        path = os.path.join(directory, name)
        status = _read(path)
        pid = status.get("pid")
        if status.get("exit_code") is not None or not isinstance(pid, int) or pid not in exits:
            continue
        status["exit_code"] = int(exits[pid])
        if status.get("end") is None:
            status["end"] = when
        if _write(path, status):
            done.append(rank)
    return done


def _read(path: str) -> Dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return {}
    try:
        with os.fdopen(fd) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: str, status: Mapping[str, Any]) -> bool:
    """Atomically, as the rank writes it: a reader never sees half a record."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with os.fdopen(os.open(tmp, PRIVATE_NEW, 0o600), "w") as f:
            json.dump(dict(status), f)
        os.replace(tmp, path)
    except OSError:
        return False
    return True
