"""host/log.py: the debug channel, off unless METAFLOW_TORCHRUN_DEBUG asks for it."""

from __future__ import annotations

import logging
import re

import pytest

from metaflow_extensions.torchrun.plugins.torchrun import spec
from metaflow_extensions.torchrun.plugins.torchrun.host import log
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import DEBUG_ENV, USER_KNOBS, read_knobs


def debug(value):
    """The setting as the step's start reads it."""
    return read_knobs({DEBUG_ENV: value} if value is not None else {})[0].debug


@pytest.fixture(autouse=True)
def fresh_logger():
    logger = logging.getLogger(log.LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    logger.handlers, logger.level, logger.propagate = [], logging.NOTSET, True
    yield logger
    logger.handlers, logger.level, logger.propagate = saved


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_on_it_writes_to_stderr_with_the_time(value, capsys):
    assert log.configure(debug(value))
    log.configure(debug(value))  # once per process, however often asked
    log.get("gang.client").debug("node %d: joined", 3)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} metaflow_torchrun\.gang\.client\[\d+\] "
                        r"debug: node 3: joined", err[0]), err


@pytest.mark.parametrize("env", [{}, {DEBUG_ENV: ""}, {DEBUG_ENV: "0"}, {DEBUG_ENV: "no"}])
def test_off_it_installs_nothing_and_says_nothing(env, capsys, fresh_logger):
    assert not log.configure(debug(env.get(DEBUG_ENV)))
    assert fresh_logger.handlers == [] and fresh_logger.level == logging.NOTSET
    log.get("gang.server").debug("verdict")
    assert capsys.readouterr().err == ""
    assert not log.get("gang.server").isEnabledFor(logging.DEBUG)  # one level check, no formatting


def test_a_knob_like_the_others(monkeypatch, capsys):
    """Declared with the knobs, read with them at the step's start, and switched on there."""
    assert DEBUG_ENV in USER_KNOBS
    knobs, refused = spec.read_settings({DEBUG_ENV: "1"})
    assert not refused and log.configure(knobs.debug)
    log.get("runtime.session").debug("call 0: begun")
    assert "metaflow_torchrun.runtime.session" in capsys.readouterr().err
