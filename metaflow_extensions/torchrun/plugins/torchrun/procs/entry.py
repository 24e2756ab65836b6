"""What a rank runs, handed to the bootstrap out of band.

torchrun's own parser (argparse with ``allow_abbrev``) reads its whole command
line: a script argument that is a prefix of one of its options (``--log``,
``--max``, ``--master``, ...) is taken for it, or refused as "ambiguous option",
even after the script's name. So the script and its arguments never go on
torchrun's command line: they are written to an entry file in the call's private
work directory, and torchrun runs ``--module <bootstrap> <entry file>``, a path
(never starting with ``-``). The bootstrap reads the file and runs the script
with ``sys.argv`` exactly as given. Its size does not count against the
system's command-line limit either.

torchrun's agent keeps its own temporary files (``TMPDIR``, set by
``launch/prepare.py``) in the work directory: the ``torchelastic_*``
directories it makes go away with it. The ranks get the user's ``TMPDIR`` back
here.
"""

from __future__ import annotations

import json
import os
from typing import Any, List, Mapping, MutableMapping, NamedTuple

from .names import AGENT_TMP, ENTRY_ENV, ENTRY_FILE, USER_TMPDIR_ENV, USER_UMASK_ENV



class Entry(NamedTuple):
    """What a rank runs, and the step's settings that reach the ranks (read at
    the step's start, ``knobs.Knobs``; never from the ranks' environment)."""

    argv: List[str]
    trainer_progress: bool = True  # METAFLOW_TORCHRUN_TRAINER_PROGRESS (trainer_hooks.py)


def write_entry(work_dir: str, argv: List[str], trainer_progress: bool = True) -> str:
    """Write the bootstrap's argv (``[script, *args]``, or the function form)
    and the settings of ``Entry`` to a new private file in ``work_dir``, beside
    the agent's temporary directory; return its path."""
    from ..host import open_private

    # torchrun's agent's own temporary files go here (launch/prepare.py's TMPDIR).
    os.makedirs(os.path.join(work_dir, AGENT_TMP), mode=0o700, exist_ok=True)
    path = os.path.join(work_dir, ENTRY_FILE)
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"argv": [str(a) for a in argv], "trainer_progress": bool(trainer_progress)}, f)
    return path


def read_entry(path: str) -> Entry:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    argv, trainer_progress = data["argv"], data.get("trainer_progress", True)
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and isinstance(trainer_progress, bool)):
        raise ValueError("%s: not an entry file" % path)
    return Entry(argv, trainer_progress)


def bootstrap_entry(argv: List[str], environ: Mapping[str, str] = os.environ) -> Entry:
    """What the bootstrap runs: the entry file when torchrun gave it the entry
    file's path (and nothing else), else ``argv`` as given, with the defaults."""
    path = environ.get(ENTRY_ENV)
    if path and argv == [path]:
        return read_entry(path)
    return Entry(list(argv))


def restore_user_tmpdir(environ: MutableMapping[str, str] = os.environ) -> None:
    """In a rank, before any user code: ``TMPDIR`` as the step had it, and
    its umask (the agent, procs/agent.py, keeps its own files private)."""
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
    import sys

    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # forget a directory chosen from the agent's TMPDIR
