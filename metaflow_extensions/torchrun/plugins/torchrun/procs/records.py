"""JSON record files of a call's work directory, written and read one way:
atomically, privately, never through a symlink; anything unreadable reads as
nothing, never as an error.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterator, Optional, Tuple

from .names import rank_of

MAX_TIME = 1e12  # epoch seconds
PRIVATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)


def write_json(path: str, data: Any) -> None:
    """Raises OSError. The temporary name carries the pid: a rank and its agent never share one."""
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
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_rank_files(directory: str, suffix: str) -> Iterator[Tuple[int, Any]]:
    """(rank, JSON) of each rank's ``suffix`` file, in name order; none where the directory is gone."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        rank = rank_of(name, suffix)
        if rank is not None:
            yield rank, read_json(os.path.join(directory, name))


def stamp(value: Any) -> Optional[float]:
    """A wall-clock time in [0, MAX_TIME] from a file, or None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok and 0 <= value <= MAX_TIME else None
