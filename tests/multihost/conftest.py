"""Fixtures of the multi-host tests.

``network(n)`` gives ``n`` hosts (network namespaces, see netns.py); ``sandbox``
gives the test's directory, token and environment, and fails the test if any
process it started is still alive afterwards. Where namespaces cannot be
created (not root, no iproute2, a sandbox forbidding them) every test that needs
them is skipped with the reason (shown by ``pytest -ra``); nothing passes without
having run. With MFTR_REQUIRE_MACHINE=1 (.ci/run sets it) they fail instead
(tests/conftest.py).
"""

import pytest

from . import netns
from .harness import Sandbox, describe

_support = {}


def _netns_reason():
    if "reason" not in _support:
        try:
            removed = netns.remove_stale()
            if removed:
                print("multihost: removed stale namespaces of a crashed run: %s" % ", ".join(removed))
            netns.check_support()
            _support["reason"] = None
        except netns.NetnsUnavailable as e:
            _support["reason"] = str(e)
        except Exception as e:  # anything else that stops us creating hosts
            _support["reason"] = "%s: %s" % (type(e).__name__, e)
    return _support["reason"]


@pytest.fixture
def sandbox(tmp_path, network):
    # Depends on ``network`` so that it is torn down first: the leak check must
    # run before deleting the namespaces kills whatever is still in them.
    box = Sandbox(tmp_path)
    try:
        yield box
    finally:
        for cleanup in box.cleanups:
            cleanup()
        leaked = box.leaks()
        box.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)


@pytest.fixture
def network(tmp_path):
    """A factory: ``network(n)`` creates ``n`` hosts, all deleted after the test."""
    reason = _netns_reason()
    if reason:  # a failure where MFTR_REQUIRE_MACHINE=1 (tests/conftest.py), as CI sets it
        pytest.skip("multi-host tests need network namespaces: " + reason)
    made = []

    def make(num_hosts):
        net = netns.Network(num_hosts, str(tmp_path))
        made.append(net)
        return net

    try:
        yield make
    finally:
        for net in made:
            net.close()
        left = [ns for ns in netns.list_netns() for net in made if ns.startswith(net.id)]
        assert not left, "namespaces left behind: %s" % left

