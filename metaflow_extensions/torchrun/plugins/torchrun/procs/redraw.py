"""A line a rank redraws with carriage returns, shown while it is redrawn.

Why: the relay hands a rank's output on in whole lines, and a progress bar
(tqdm, as HF's ``Trainer`` and Lightning draw it) is one line redrawn with
``\\r``, ended by a newline only when the bar closes. Held for its newline, the
bar showed only after training, as one line of every state it ever had. Here
the latest state goes out as a line of its own, at most every
``timeouts.REDRAW_SECONDS``, and the bar's final line once; the console never
gets a line that grows with the run. The per-rank log keeps every byte as the
rank wrote it (the relay writes what ``take`` returns to it at once), so the
text held back is at most one state, whatever the run's length.

Pure: the relay (relay.py) feeds it, with its own clock.
"""

from __future__ import annotations

from typing import Optional, Tuple

from ..base import timeouts

# A state is cut to this many bytes on the console (a bar is a few hundred);
# one line of it stays one atomic write with its label.
MAX_STATE = 2048


def last_state(text: bytes) -> bytes:
    """What a terminal shows of ``text`` redrawn with ``\\r``: its last piece
    with something in it, without the spaces that erase a longer state."""
    end = len(text)
    while end > 0:
        start = text.rfind(b"\r", 0, end) + 1
        piece = text[start:end].rstrip(b" ")
        if piece.strip():
            return piece[:MAX_STATE]
        end = start - 1
    return b""


def collapse(lines: bytes) -> bytes:
    """Whole lines, each redrawn one cut to its last state."""
    if b"\r" not in lines:
        return lines  # the common case: no copy
    return b"\n".join(last_state(line) if b"\r" in line else line for line in lines[:-1].split(b"\n")) + b"\n"


class Redraw:
    """The one line of a stream being redrawn, if any, and what of it was shown."""

    def __init__(self, every: Optional[float] = None) -> None:
        self.every = timeouts.REDRAW_SECONDS if every is None else every
        self.state = b""  # the latest state of the line being redrawn
        self.shown = b""  # its last state shown
        self.shown_at = float("-inf")  # when a state was last shown, of any line
        self.active = False  # a line is being redrawn

    def take(self, pending: bytes, show: bool = True) -> Tuple[bytes, bytes]:
        """Split an unterminated tail into what is drawn over (up to its last
        ``\\r``, for the log now) and what stays pending; keep the latest state
        (unless ``show`` is false: the console must not have it)."""
        cut = pending.rfind(b"\r")
        if cut < 0:
            return b"", pending
        drawn, rest = pending[: cut + 1], pending[cut + 1 :]
        self.active = True
        if show:
            self.state = last_state(rest) or last_state(drawn) or self.state
        return drawn, rest

    def due(self) -> Optional[float]:
        """When the latest state is to be shown (a monotonic time), if at all."""
        if not self.state or self.state == self.shown:
            return None
        return self.shown_at + self.every

    def show(self, now: float) -> bytes:
        """The latest state as a line, when it is due."""
        at = self.due()
        if at is None or now < at:
            return b""
        self.shown, self.shown_at = self.state, now
        return self.state + b"\n"

    def end_line(self, lines: bytes) -> bytes:
        """Whole lines for the console: the first ends the line being redrawn.
        Its final state is shown unless it was just shown (then only what was
        written after it); an empty end (``\\r`` then a newline) shows the
        state not shown yet, or nothing."""
        lines = collapse(lines)
        if not self.active:
            return lines
        first, _, rest = lines.partition(b"\n")
        final = first if first.strip() else self.state
        if self.shown and final.startswith(self.shown):
            # Shown already; what another writer added to it (a library's
            # warning from C++, without a newline of its own) is a line of its own.
            final = final[len(self.shown):]
        self.active, self.state, self.shown = False, b"", b""
        return (final + b"\n" if final else b"") + rest

    def flush(self) -> bytes:
        """At the stream's end: the state not shown yet, if any."""
        at = self.due()
        self.active = False
        if at is None:
            return b""
        state, self.state, self.shown = self.state, b"", b""
        return state + b"\n"
