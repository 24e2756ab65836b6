"""Each complete shard's snapshot, pushed to the buddy node's store in the background.

Off the training's path: the store names a committed snapshot (key and step) and returns; this
thread pins its slot, computes its digest and sends it from there. At most one waits per key: a
newer one replaces one not yet sent, so a slow link costs steps of the copy's freshness, never
memory: the buddy's copy of a key is at most one push behind its newest save. Where a push takes longer
than two saves, the buddy holds no step the node still keeps, and a node lost then resumes from the
checkpoint: said once, with the push's time.
A buddy that cannot be reached or refuses is said once, and tried again with the next snapshot.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Optional

from ..rank import wire
from .peer import Address, Channel, PeerKey, PeerRefused, connect, push
from .shelf import Shelf, Slot


class Pusher:
    def __init__(self, key: PeerKey, shelf: Shelf, buddy: Optional[Address], say: Callable[[str], None]) -> None:
        self._key = key
        self._shelf = shelf
        self._buddy = buddy
        self._say = say
        self._said = False
        self._said_behind = False
        self._copied: Dict[str, int] = {}  # key -> the newest step the buddy took
        self._began: Optional[float] = None  # when the push under way began (monotonic)
        self._pending: Dict[str, int] = {}  # key -> the step to send
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self._channel: Optional[Channel] = None
        self.pushed = 0  # snapshots the buddy took: the tests' and the benchmark's count
        self._thread = threading.Thread(target=self._run, name="snapshot-push", daemon=True)
        self._thread.start()

    def offer(self, key: str, step: int) -> None:
        with self._cond:
            self._pending[key] = step  # supersedes one not yet sent
            self._cond.notify()
            copied, began, said = self._copied.get(key), self._began, self._said_behind
        kept = self._shelf.steps(key)
        if not said and copied is not None and kept and copied < kept[0]:
            self._said_behind = True
            self._say("the copy of %s on the buddy node holds step %d, older than every step this node keeps (%s; "
                      "a push under way for %.1f s, longer than two saves): a node lost now resumes from its "
                      "checkpoint until the copy catches up; save sharded state less often to keep it within reach"
                      % (key, copied, ", ".join(map(str, kept)), time.monotonic() - began if began else 0.0))

    def buddy_changed(self, buddy: Optional[Address]) -> None:
        """A swap gave this node another buddy: what is pending goes there."""
        with self._cond:
            self._buddy = buddy
            self._copied.clear()  # the new buddy holds none of them yet
            channel, self._channel = self._channel, None
            self._cond.notify()
        if channel:
            channel.close()

    def idle(self, timeout: float) -> bool:
        """Whether everything offered so far was sent (or dropped) within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._closed or bool(self._pending and self._buddy is not None))
                if self._closed:
                    return
                key = next(iter(self._pending))
                step, buddy = self._pending.pop(key), self._buddy
                self._busy = True
            slot = self._shelf.pin(key, step)
            if slot is None:
                continue  # dropped since (a newer one is pending, or the store closed)
            with self._cond:
                self._began = time.monotonic()
            try:
                sent = self._send(slot, buddy)
            finally:
                self._shelf.unpin(slot)
            with self._cond:
                self._began = None
                if sent:
                    self._copied[key] = step

    def _send(self, slot: Slot, buddy: Optional[Address]) -> bool:
        assert buddy is not None
        try:
            if self._channel is None:
                self._channel = connect(self._key, buddy)
            why = push(self._channel, slot)
        except (OSError, PeerRefused, wire.WireError) as e:
            channel, self._channel = self._channel, None
            if channel:
                channel.close()
            why = str(e)
        if why is None:
            self.pushed += 1
            return True
        if not self._said:
            self._said = True
            self._say("snapshots are not copied to node %s:%d (%s): a node lost is restored from its "
                      "checkpoint, not from memory" % (buddy[0], buddy[1], why))
        return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
            channel, self._channel = self._channel, None
        if channel:
            channel.close()
        self._thread.join(timeout=5)
