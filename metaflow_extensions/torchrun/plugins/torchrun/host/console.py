"""The one way the task process talks to the user outside an error: a line on
stderr that starts with ``@torchrun: `` (stdout may be machine-readable, e.g.
``argo-workflows create --only-json``). Messages are built without the prefix;
``say`` adds it, once."""

from __future__ import annotations

import sys
from typing import IO, Callable, Iterable, Optional, Set, Tuple

PREFIX = "@torchrun: "


def line(text: str) -> str:
    return text if text.startswith(PREFIX) else PREFIX + text


def say(text: str, frame: Optional[str] = None, stream: Optional[IO[str]] = None) -> None:
    """Print ``@torchrun: text``; ``frame``: a rule above and below, set apart
    from the interleaved logs (the gang's root cause)."""
    out = line(text)
    if frame:
        out = "\n%s\n%s\n%s" % (frame, out, frame)
    try:
        print(out, file=stream or sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed stderr must not fail the step
        pass


# Lines already said, by (key, text): a deprecation note is said once per step
# (the key), however many calls repeat it.
_said: Set[Tuple[str, str]] = set()


def say_once(key: str, lines: Iterable[str], say: Callable[[str], None] = say) -> None:
    for text in lines:
        if (key, text) not in _said:
            _said.add((key, text))
            say(text)
