"""The debug channel, ``logging.getLogger("metaflow_torchrun")``: the gang's protocol
and the stop path log what happens, with times, at a level check's cost while nobody
listens. ``METAFLOW_TORCHRUN_DEBUG=1`` sends it to stderr; else the application's ``logging`` decides.
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
    """Switch the channel on when ``Knobs.debug`` asks for it; once per process."""
    if not on:
        return False
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return True
