"""A line a rank redraws with ``\\r`` (a tqdm bar), shown while it is redrawn.

Held for its newline, a bar showed only after training, as one line of every
state it had. Here its latest state goes out as a line of its own, at most every
``timeouts.REDRAW_SECONDS``; the rank's log keeps every byte. A line still
without its newline after ``timeouts.HELD_LINE`` (``print("saving...", end="")``)
shows the same way: held for a newline that never came, the last words of a rank
whose node was killed reached its log only. Pure: the relay feeds it, with its
own clock.
"""

from __future__ import annotations

from typing import Optional, Tuple

from ..base import timeouts

# A state on the console (a bar is a few hundred bytes): one atomic write with its label.
MAX_STATE = 2048


def last_state(text: bytes) -> bytes:
    """What a terminal shows of ``text``, less the spaces that erase a longer state."""
    end = len(text)
    while end > 0:
        start = text.rfind(b"\r", 0, end) + 1
        piece = text[start:end].rstrip(b" ")
        if piece.strip():
            return piece[:MAX_STATE]
        end = start - 1
    return b""


def collapse(lines: bytes) -> bytes:
    if b"\r" not in lines:
        return lines  # the common case: no copy
    return b"\n".join(last_state(line) if b"\r" in line else line for line in lines[:-1].split(b"\n")) + b"\n"


class Redraw:
    def __init__(self, every: Optional[float] = None, hold: Optional[float] = None) -> None:
        self.every = timeouts.REDRAW_SECONDS if every is None else every
        self.hold = timeouts.HELD_LINE if hold is None else hold
        self.state = b""  # the latest state of the line being redrawn
        self.shown = b""  # its last state shown
        self.shown_at = float("-inf")  # when a state was last shown, of any line
        self.active = False  # a line is being redrawn
        self.held_since: Optional[float] = None  # when the line began, if it is held (no "\r" in it yet)

    def take(self, pending: bytes, show: bool = True, now: float = 0.0) -> Tuple[bytes, bytes]:
        """(what is drawn over, for the log now; what stays pending)."""
        cut = pending.rfind(b"\r")
        if cut < 0:
            self._hold(pending, show, now)
            return b"", pending
        drawn, rest = pending[: cut + 1], pending[cut + 1 :]
        self.active, self.held_since = True, None
        if show:
            self.state = last_state(rest) or last_state(drawn) or self.state
        return drawn, rest

    def _hold(self, pending: bytes, show: bool, now: float) -> None:
        """``pending``, a line without its newline so far: its state as it stands, due ``hold`` after it began."""
        if not pending.strip(b" \t"):
            return
        if not self.active:
            self.active, self.held_since = True, now
        if show:
            self.state = pending[:MAX_STATE].rstrip(b" ")

    def due(self) -> Optional[float]:
        if not self.state or self.state == self.shown:
            return None
        at = self.shown_at + self.every
        return at if self.held_since is None else max(at, self.held_since + self.hold)

    def show(self, now: float) -> bytes:
        at = self.due()
        if at is None or now < at:
            return b""
        self.shown, self.shown_at = self.state, now
        return self.state + b"\n"

    def end_line(self, lines: bytes) -> bytes:
        """The first line ends the one being redrawn: its final state unless just shown."""
        lines = collapse(lines)
        if not self.active:
            return lines
        if self.held_since is not None and not self.shown:  # held, never shown: the line goes out as it is
            self.active, self.state, self.held_since = False, b"", None
            return lines
        first, _, rest = lines.partition(b"\n")
        final = first if first.strip() else self.state
        if self.shown and final.startswith(self.shown):
            # What another writer added (C++'s warning, no newline of its own) is a line of its own.
            final = final[len(self.shown):]
        self.active, self.state, self.shown, self.held_since = False, b"", b"", None
        return (final + b"\n" if final else b"") + rest

    def flush(self) -> bytes:
        at = self.due()
        self.active, self.held_since = False, None
        if at is None:
            return b""
        state, self.state, self.shown = self.state, b"", b""
        return state + b"\n"
