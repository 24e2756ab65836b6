"""A node keeps its ranks alive for STACKS_HOLD after it began collecting
their stacks (runtime/call_stacks.py): the gang's other nodes begin their
collecting up to a tick later, and would find a peer's ranks gone."""

from __future__ import annotations

import time
from types import SimpleNamespace

from metaflow_extensions.torchrun.plugins.torchrun import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_stacks import CallStacks


class _Client:
    def __init__(self):
        self.sent = []

    def send_stacks(self, index, stacks, flights):
        self.sent.append((index, time.monotonic()))


def test_the_ranks_stop_only_after_the_hold_and_the_stacks_go_out_at_once(tmp_path):
    client = _Client()
    session = SimpleNamespace(client=client)
    supervisor = SimpleNamespace(live_pids=lambda: set())
    began = time.monotonic()
    CallStacks().collect(session, 0, supervisor, str(tmp_path))
    returned = time.monotonic()
    assert returned - began >= timeouts.STACKS_HOLD  # the supervisor's SIGTERM comes after this
    assert len(client.sent) == 1 and client.sent[0][1] - began < timeouts.STACKS_HOLD  # shared first
