"""The one way the task process talks to the user outside an error: a line on
stderr that starts with ``@torchrun: `` (stdout may be machine-readable, e.g.
``argo-workflows create --only-json``). Messages are built without the prefix;
``say`` adds it, once."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Callable, Iterable, Optional, Set, Tuple
from ..base import timeouts

PREFIX = "@torchrun: "
# Our lines and the ranks' share the task's streams. A line of ours goes out
# whole, between the ranks' writes, never inside one (a rank printing a tensor
# over 200 lines): the ranks' output is written under this lock (the
# supervisor's pumps, ``rank_output``), and ``say`` waits for a pause in it of
# ``timeouts.QUIET`` seconds (at most ``QUIET_WAIT``). It writes to the stream
# the ranks wrote to last: Metaflow's runtime reads a task's stdout and stderr a
# line at a time each, in turn, so a line on the other stream would land inside
# their lines on the console.

_lock = threading.Lock()


class _Ranks:
    stream: Optional[IO[str]] = None  # where the ranks wrote last
    at = 0.0  # when (monotonic)


def rank_output(stream: IO[str], write: Callable[[], None]) -> None:
    """Write the ranks' output (whole lines) with ``write``, apart from ours."""
    with _lock:
        try:
            write()
        finally:
            _Ranks.stream, _Ranks.at = stream, time.monotonic()


def line(text: str) -> str:
    return text if text.startswith(PREFIX) else PREFIX + text


def say(text: str, frame: Optional[str] = None, stream: Optional[IO[str]] = None) -> None:
    """Print ``@torchrun: text``; ``frame``: a rule above and below, set apart
    from the interleaved logs (the gang's root cause)."""
    out = line(text)
    if frame:
        out = "\n%s\n%s\n%s" % (frame, out, frame)
    deadline = time.monotonic() + timeouts.QUIET_WAIT
    while True:
        with _lock:
            since = time.monotonic() - _Ranks.at
            if since >= timeouts.QUIET or time.monotonic() >= deadline:
                # The ranks' last stream, while it is still one of the task's own.
                ranks = _Ranks.stream if _Ranks.stream in (sys.stdout, sys.stderr) else None
                try:
                    print(out, file=stream or ranks or sys.stderr, flush=True)
                except (OSError, ValueError):  # a closed stream must not fail the step
                    pass
                return
        time.sleep(max(0.005, timeouts.QUIET - since))


# Lines already said, by (key, text): a deprecation note is said once per step
# (the key), however many calls repeat it.
_said: Set[Tuple[str, str]] = set()


def say_once(key: str, lines: Iterable[str], say: Callable[[str], None] = say) -> None:
    for text in lines:
        if (key, text) not in _said:
            _said.add((key, text))
            say(text)
