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

The same module points torchrun's agent at the work directory for its own
temporary files (``TMPDIR``): the ``torchelastic_*`` directories it makes go
away with the work directory. The ranks get the user's ``TMPDIR`` back.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, MutableMapping

from .names import AGENT_TMP, ENTRY_ENV, ENTRY_FILE, USER_TMPDIR_ENV



def write_entry(work_dir: str, argv: List[str]) -> str:
    """Write the bootstrap's argv (``[script, *args]``, or the function form)
    to a new private file in ``work_dir``; return its path."""
    from ..host.private import open_private

    path = os.path.join(work_dir, ENTRY_FILE)
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"argv": [str(a) for a in argv]}, f)
    return path


def read_entry(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        argv = json.load(f)["argv"]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("%s: not an entry file" % path)
    return argv


def bootstrap_argv(argv: List[str], environ: Mapping[str, str] = os.environ) -> List[str]:
    """The bootstrap's real argv: read from the entry file when torchrun gave it
    the entry file's path (and nothing else), else ``argv`` as given."""
    path = environ.get(ENTRY_ENV)
    if path and argv == [path]:
        return read_entry(path)
    return list(argv)


def agent_environment(env: Mapping[str, str], work_dir: str, entry_path: str) -> Dict[str, str]:
    """torchrun's environment: its temporary files in the work directory, the
    user's own ``TMPDIR`` kept aside for the ranks, and the entry file."""
    out = dict(env)
    tmp = os.path.join(work_dir, AGENT_TMP)
    os.makedirs(tmp, mode=0o700, exist_ok=True)
    out[USER_TMPDIR_ENV] = env.get("TMPDIR", "")
    out["TMPDIR"] = tmp
    out[ENTRY_ENV] = entry_path
    return out


def restore_user_tmpdir(environ: MutableMapping[str, str] = os.environ) -> None:
    """In a rank, before any user code: ``TMPDIR`` as the step had it."""
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
