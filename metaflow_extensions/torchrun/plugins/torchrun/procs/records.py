"""JSON record files of a call's work directory, written and read one way.

Ranks, their agent and the task all exchange small JSON records through the
work directory (a rank's status and failure, the agent's report of the ranks
torch saw fail). Each is written atomically (a reader never sees half a
record), privately (0600) and never through a symlink, and read back without
following one; anything unreadable reads as nothing, never as an error. No
Metaflow, no torch: every rank imports this.
"""

from __future__ import annotations

import json
import os
from typing import Any

# A new file only this user can read (0600), never through a symlink.
PRIVATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)


def write_json(path: str, data: Any) -> None:
    """Write ``data`` to ``path`` atomically; raises OSError. The temporary
    name carries the writer's pid, so a rank and its agent never share one."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with os.fdopen(os.open(tmp, PRIVATE_NEW, 0o600), "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str) -> Any:
    """The JSON in ``path``, or None when it is missing, a symlink or not JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
