"""What the control says while nothing is wrong: who the gang waits for, at a
calm rate; the progress line when it changed; each straggler once. Past 512
nodes the training summary is made less often, as heartbeats are.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..base import timeouts
from .config import HEARTBEATS_PER_SECOND, GangConfig
from .gang_progress import ProgressBook


class Speaker:
    def __init__(self, config: GangConfig, started: float, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self._next_training = 0.0
        self._last_line = started
        self._said_line: Optional[str] = None  # the same line is not said twice
        self._last_waiting = started
        self._said_waiting = False

    def tick(self, now: float, training: ProgressBook, waiting: Callable[[], Optional[str]]) -> None:
        if now >= self._next_training:
            per_second = max(1.0, self.config.num_nodes / HEARTBEATS_PER_SECOND)
            self._next_training = now + timeouts.PROGRESS_CHECK * per_second
            for straggler in training.check(now):
                self.say(straggler.sentence())
            line = training.line()
            if line not in (None, self._said_line) and now - self._last_line >= self.config.progress_interval:
                self._last_line, self._said_line = now, line
                self.say(line)
        missing = waiting()
        if not missing:
            if self._said_waiting:
                self._said_waiting = False
                self.say("all %d nodes are there" % self.config.num_nodes)
            return
        if now - self._last_waiting >= self.config.progress_interval:
            self._last_waiting = now
            self._said_waiting = True
            self.say(missing)
