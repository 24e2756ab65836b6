"""The debug channel: ``logging.getLogger("metaflow_torchrun")``.

Debugging the gang's protocol or the stop path should not mean editing code.
The task's modules log what happens there (a node joins, a call is entered,
told to go and done, a failure is seen, the verdict, a stop begun and ended,
with how long each took) as debug records under this logger. They cost one
level check while nobody listens.

``METAFLOW_TORCHRUN_DEBUG=1`` (or a Metaflow profile's value; the step's
start reads it, knobs.py) switches them on: ``configure`` then sends them to stderr, each
with its time to the millisecond, the logger's name and the process id.
Without it this module installs nothing, and the records go where the
application's own ``logging`` configuration sends them, as any library's do.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "metaflow_torchrun"
FORMAT = "%(asctime)s.%(msecs)03d %(name)s[%(process)d] debug: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def get(part: str) -> logging.Logger:
    """The logger of one part of the package (``gang.client``, ...), under ours."""
    return logging.getLogger("%s.%s" % (LOGGER_NAME, part))


class _Stderr(logging.StreamHandler):
    """sys.stderr as it is when a record is written (Metaflow swaps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))

    @property
    def stream(self):  # noqa: D401
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure(on: bool) -> bool:
    """Switch the channel on when ``METAFLOW_TORCHRUN_DEBUG`` (``Knobs.debug``)
    asks for it; once per process."""
    if not on:
        return False
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return True
