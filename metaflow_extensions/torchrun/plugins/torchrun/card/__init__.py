"""The step's card: its content (``content`` and its sections), its text helpers (``text``) and its
place in Metaflow's card lifecycle (``lifecycle``). Built from records alone, never a session: it
renders with no process and no socket.
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
