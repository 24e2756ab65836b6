"""The step's card: its content (``content`` and its sections), its text helpers (``text``) and its
place in Metaflow's card lifecycle (``lifecycle``). Built from records alone, never a session: it
renders with no process and no socket.
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False

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

# Where each name lives: loaded on first use, so that `import metaflow` (which imports our
# decorator and exported classes) does not load the whole layer.
_MODULES = {
    "lifecycle": (
        "attach_card", "card_of_task", "card_ready", "card_view_command", "finish_card",
        "refresh_live", "render_card_now", "this_card_hash",
    ),
}

if TYPE_CHECKING:
    from .lifecycle import (attach_card, card_of_task, card_ready, card_view_command, finish_card, refresh_live,
                            render_card_now, this_card_hash)

__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
