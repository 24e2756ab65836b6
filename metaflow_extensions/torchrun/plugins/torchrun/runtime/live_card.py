"""The control's card while a call runs: its progress section refreshed as the ranks report."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..base import timeouts
from ..gang.client import GangClient
from ..gang.gang_progress import ProgressRecord


class LiveCard:
    """The control's card, refreshed while the ranks report progress (or a
    straggler was named): at the first report, then every LIVE_CARD_EVERY."""

    def __init__(self, client: GangClient, refresh: Optional[Callable[[ProgressRecord], None]]) -> None:
        self.client = client
        self.refresh = refresh
        self.next = 0.0
        self.looked = 0.0

    def tick(self) -> None:
        refresh, now = self.refresh, time.monotonic()
        if refresh is None or now < self.next or now - self.looked < timeouts.TRACK_INTERVAL:
            return
        self.looked = now
        record = self.client.progress_record()
        if record is not None and (record.step is not None or record.stragglers):
            self.next = now + timeouts.LIVE_CARD_EVERY
            refresh(record)
