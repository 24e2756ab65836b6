"""Unit-test set-up.

Every pid a test starts is registered with the ``procs`` fixture, which SIGKILLs
whatever is still running at teardown (by pid and start time, so a recycled pid
is never touched) and reaps what it can. Process helpers live in
``proc_helpers.py``, importable whatever pytest's import mode. ``net`` makes the
gang's real servers, clients and raw peers (``gang_net.py``) and closes them all.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gang_net import Net  # noqa: E402
from proc_helpers import Procs  # noqa: E402


@pytest.fixture
def procs():
    p = Procs()
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture
def net(procs):
    n = Net(procs)
    try:
        yield n
    finally:
        n.close()
