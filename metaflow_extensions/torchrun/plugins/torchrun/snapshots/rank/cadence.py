"""How often the trainers' callbacks take a snapshot: every N steps, N the user's or chosen so
that a save costs at most 5 % of the training time.

A measured N is chosen from the time a save takes to return (what training waits for) and the
time of a step without one, again at a few early steps, since the first save also connects to
the store and the first steps warm up. Every rank must save at the same steps, or no step is
held by all of them (the store keeps two): the ranks take the largest of their choices, at
steps every rank reaches together.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, List, Optional

BUDGET = 0.05  # of the training time, for the saves
MEASURED = 2  # a measured N's first saves, at the first calls: the first also connects, so the second is timed
CHECKS = (3, 6, 12, 24, 48)  # the callback's calls at which a measured N is chosen again
MAX_EVERY = 1_000_000


def every_from_setting(text: str) -> Optional[int]:
    """The user's N; None for "choose it" ("" or "0"). Anything else is refused with the setting's meaning."""
    text = text.strip()
    if text in ("", "0"):
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_EVERY:
        raise ValueError("%r is no number of steps: a whole number from 1 to %d, or 0 to choose it from a "
                         "save's cost" % (text[:40], MAX_EVERY))
    return int(text)


def chosen_every(save_seconds: List[float], step_seconds: List[float], budget: float = BUDGET) -> int:
    """The smallest N with save / (N x step) <= budget. The first save (it connects) counts only alone."""
    if not save_seconds or not step_seconds:
        return 1
    save = statistics.fmean(save_seconds[1:] or save_seconds)
    step = statistics.median(step_seconds)
    if save <= 0:
        return 1
    if step <= 0:
        return MAX_EVERY
    return max(1, min(MAX_EVERY, math.ceil(save / (budget * step) - 1e-9)))


class Cadence:
    """One rank's schedule. ``agree`` takes this rank's N and returns the gang's (the largest);
    ``say`` is rank 0's voice (a no-op elsewhere), given the first N chosen only: each later choice is
    measured on more steps and may differ by a step or two, and a line per choice was a line per check."""

    def __init__(self, every: Optional[int], agree: Callable[[int], int], say: Callable[[str], None],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.fixed = every
        self.every = every or 1
        self._agree, self._say, self._clock = agree, say, clock
        self._calls = 0
        self._since: Optional[float] = None  # when training went on after the last call
        self._said = False
        self.save_seconds: List[float] = []
        self.step_seconds: List[float] = []

    def due(self, step: int) -> bool:
        """At a step's end, the same steps on every rank: whether to save now."""
        now = self._clock()
        if self._since is not None:
            self.step_seconds.append(now - self._since)
            del self.step_seconds[:-64]
        self._calls += 1
        if self.fixed is None:
            if self._calls <= MEASURED:
                return True  # the saves whose cost N is chosen from
            if self._calls in CHECKS:
                self._choose()
        return step % self.every == 0

    def saved(self, seconds: float) -> None:
        self.save_seconds.append(seconds)
        del self.save_seconds[1:-16]

    def resume(self) -> None:
        """Training goes on: the next step's time starts here, the saves' own time left out."""
        self._since = self._clock()

    def _choose(self) -> None:
        self.every = self._agree(chosen_every(self.save_seconds, self.step_seconds))
        if not self._said and self.save_seconds and self.step_seconds:
            self._said = True
            save = statistics.fmean(self.save_seconds[1:] or self.save_seconds)
            step = statistics.median(self.step_seconds)
            self._say("a snapshot every %d step%s: a save costs %.1f ms, a step %.1f ms (at most %d %% of the "
                      "training time; %s sets it)" % (self.every, "" if self.every == 1 else "s", save * 1e3,
                                                     step * 1e3, round(BUDGET * 100), "@torchrun(snapshots=N)"))
