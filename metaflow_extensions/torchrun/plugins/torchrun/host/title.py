"""What ``ps``, ``top``, ``py-spy`` and ``pgrep -f`` show for a process of ours: a
process forked from the warm process would show its command line for life. The
why and the bounds: docs/design.md ("What process tools see of a forked rank").
"""

from __future__ import annotations

import importlib.util
import os

from .proctree import name_this_process

TYPE_CHECKING = False  # typing unimported: a zygote's stand-in loads this (procs/handoff.py)
if TYPE_CHECKING:
    from typing import Any, List, Optional, Sequence

ROOM = 4096  # blanks a forking process keeps in its command line for its children's titles
_NOENV = "SPT_NOENV"

_spt: Any = None  # setproctitle's C module, once prepared
_prepared: Optional[bool] = None


def available() -> bool:
    """Whether setproctitle is installed for this interpreter (without importing it)."""
    try:
        return importlib.util.find_spec("setproctitle") is not None
    except (ImportError, ValueError):
        return False


def room() -> List[str]:
    """An argument giving a forking process's children room for their titles: none where none can be written."""
    return [" " * ROOM] if available() else []


def prepare() -> bool:
    """Find the argv memory before anything changes the C environment (setproctitle walks
    back from its first string); once per process, inherited by a fork. False without setproctitle."""
    global _spt, _prepared
    if _prepared is not None:
        return _prepared
    _prepared = False
    try:
        import setproctitle

        spt = setproctitle._setproctitle  # absent where its C part did not build: the package then does nothing
    except (ImportError, AttributeError):
        return False
    before = os.environ.get(_NOENV)
    if not before:
        os.environ[_NOENV] = "1"  # read once, by the setup below: keep /proc/PID/environ whole
    name = _own_name()
    try:
        spt.getproctitle()
    except Exception:
        return False
    finally:
        if before is None:
            os.environ.pop(_NOENV, None)
        elif not before:
            os.environ[_NOENV] = before
        if name:
            name_this_process(name)  # the setup names the process after its command line: not yet
    _spt, _prepared = spt, True
    return True


def _own_name() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def show(words: Sequence[str], short: str) -> bool:
    """Be ``words`` to ``ps -o args`` and ``short`` to ``ps -o comm``; True where the full title is shown."""
    shown = False
    if prepare():
        try:
            _spt.setproctitle(" ".join(words))  # it also names the process: ours comes after
            shown = True
        except Exception:
            pass
    name_this_process(short.encode(errors="replace") or b"python")
    return shown


def command_line(pid: int) -> Optional[str]:
    """What ``ps -o args`` shows for ``pid``; None once it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return " ".join(a.decode(errors="replace") for a in data.split(b"\0") if a).rstrip()
