"""What a rank runs, handed to the bootstrap in a file: torchrun's parser
(``allow_abbrev``) takes a script argument that prefixes one of its options
(``--log``, ``--max``) for its own, even after the script's name.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, List, Mapping, MutableMapping, NamedTuple

from ..host.private import open_private
from .names import AGENT_TMP, ENTRY_ENV, ENTRY_FILE, USER_TMPDIR_ENV, USER_UMASK_ENV


class Entry(NamedTuple):
    """The step's settings reach the ranks here, never through their environment."""

    argv: List[str]
    trainer_progress: bool = True  # METAFLOW_TORCHRUN_TRAINER_PROGRESS (trainer_hooks.py)
    arrivals: bool = True  # METAFLOW_TORCHRUN_ARRIVALS (arrivals.py)


def write_entry(work_dir: str, argv: List[str], trainer_progress: bool = True, arrivals: bool = True) -> str:
    """The entry file's path, in ``work_dir`` beside the agent's temporary directory."""
    # torchrun's agent's own temporary files go here (launch/prepare.py's TMPDIR).
    os.makedirs(os.path.join(work_dir, AGENT_TMP), mode=0o700, exist_ok=True)
    path = os.path.join(work_dir, ENTRY_FILE)
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"argv": [str(a) for a in argv], "trainer_progress": bool(trainer_progress),
                   "arrivals": bool(arrivals)}, f)
    return path


def read_entry(path: str) -> Entry:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    argv, trainer_progress, arrivals = data["argv"], data.get("trainer_progress", True), data.get("arrivals", True)
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and isinstance(trainer_progress, bool)
            and isinstance(arrivals, bool)):
        raise ValueError("%s: not an entry file" % path)
    return Entry(argv, trainer_progress, arrivals)


def bootstrap_entry(argv: List[str], environ: Mapping[str, str] = os.environ) -> Entry:
    """The entry file when torchrun gave its path alone, else ``argv`` as given."""
    path = environ.get(ENTRY_ENV)
    if path and argv == [path]:
        return read_entry(path)
    return Entry(list(argv))


def restore_user_tmpdir(environ: MutableMapping[str, str] = os.environ) -> None:
    """Before any user code: the step's ``TMPDIR`` and umask (the agent's were its own)."""
    umask = environ.pop(USER_UMASK_ENV, "")
    if umask:
        try:
            os.umask(int(umask, 8) & 0o777)
        except ValueError:
            pass
    if USER_TMPDIR_ENV not in environ:
        return
    user = environ.pop(USER_TMPDIR_ENV)
    if user:
        environ["TMPDIR"] = user
    else:
        environ.pop("TMPDIR", None)
    environ.pop(ENTRY_ENV, None)
    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # forget a directory chosen from the agent's TMPDIR
