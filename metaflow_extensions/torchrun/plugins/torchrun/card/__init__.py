"""The step's card: built from records alone, never a session, so it renders with no process
and no socket.

- its place in Metaflow's card lifecycle: ``lifecycle`` (added to the step, refreshed live,
  rendered at the end);
- its content: ``content`` (the run at a glance) and its sections ``progress``, ``preflight``
  and ``timeline``;
- ``text``: text we did not write (a rank's output, a host name), made safe and bounded.

It may import ``record`` and the rooms below it, and Metaflow's cards; never the runtime
(import-linter holds it).
"""

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
