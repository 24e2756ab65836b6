"""The step's card: what it shows (``content``, its sections ``timeline``,
``progress``, ``preflight``), the text helpers that keep a rank's text safe and
bounded in it (``text``), and its place in Metaflow's card lifecycle
(``lifecycle``: added to the step, refreshed live, rendered in the task).

It reads records (``record/``), never a session: a card is built from a
``TorchrunResult`` or a progress record alone, so it renders with no process
and no socket.
"""

from __future__ import annotations

from .lifecycle import (attach_card, card_of_task, card_ready, card_view_command, finish_card, refresh_live,
                        render_card_now, this_card_hash)

__all__ = [
    "attach_card",
    "card_of_task",
    "card_ready",
    "card_view_command",
    "finish_card",
    "refresh_live",
    "render_card_now",
    "this_card_hash",
]
