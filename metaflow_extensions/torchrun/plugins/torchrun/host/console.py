"""The one way the task talks to the user outside an error: a line that starts
with ``@torchrun: `` (added once, by ``say``), on stderr unless the ranks wrote
last to stdout (which may be machine-readable: ``argo-workflows create --only-json``)."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Callable, Iterable, Optional, Set, Tuple
from ..base import timeouts

PREFIX = "@torchrun: "
# A line of ours goes out whole between the ranks' writes (``rank_output``), after a pause of
# ``QUIET`` (at most ``QUIET_WAIT``), on the stream they wrote last: Metaflow reads stdout and
# stderr a line at a time each, in turn, so a line on the other stream would land inside theirs.

_lock = threading.Lock()


class _Ranks:
    stream: Optional[IO[str]] = None  # where the ranks wrote last
    at = 0.0  # when (monotonic)


def rank_output(stream: IO[str], write: Callable[[], None]) -> None:
    with _lock:
        try:
            write()
        finally:
            _Ranks.stream, _Ranks.at = stream, time.monotonic()


def say(text: str) -> None:
    """Print ``@torchrun: text``, whole, between the ranks' lines."""
    out = text if text.startswith(PREFIX) else PREFIX + text
    deadline = time.monotonic() + timeouts.QUIET_WAIT
    while True:
        with _lock:
            since = time.monotonic() - _Ranks.at
            if since >= timeouts.QUIET or time.monotonic() >= deadline:
                # The ranks' last stream, while it is still one of the task's own.
                ranks = _Ranks.stream if _Ranks.stream in (sys.stdout, sys.stderr) else None
                stream = ranks or sys.stderr
                try:  # one write: print() may write the text and its newline apart (PYTHONUNBUFFERED)
                    stream.write(out + "\n")
                    stream.flush()
                except (OSError, ValueError):  # a closed stream must not fail the step
                    pass
                return
        time.sleep(max(0.005, timeouts.QUIET - since))


# Lines already said, by (key, text): a deprecation note once per step, however many calls repeat it.
_said: Set[Tuple[str, str]] = set()


def say_once(key: str, lines: Iterable[str], say: Callable[[str], None] = say) -> None:
    for text in lines:
        if (key, text) not in _said:
            _said.add((key, text))
            say(text)
