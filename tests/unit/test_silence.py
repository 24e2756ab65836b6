"""gang/silence.py: who is named when nodes fall silent (the control's view).

From inside a partition the control cannot tell which side was cut: one silent
worker among answering ones is that worker's fault; every other node silent
from the same moment is lost contact, with the control the likely one cut off
at three nodes or more."""

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.cause import CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang.silence import TOGETHER, silence_cause

LIMIT = 8.0
LIVE = 0.4  # a node heard a moment ago


def hosts(n):
    return {i: "host%d" % i for i in range(n)}


def test_nobody_past_the_timeout_is_no_cause():
    assert silence_cause({0: LIVE, 1: LIMIT - 0.1, 2: LIMIT}, hosts(3), LIMIT) is None


def test_one_worker_silent_while_the_others_answer_is_that_workers_fault():
    cause = silence_cause({0: LIVE, 1: LIVE, 2: 8.3, 3: LIVE}, hosts(4), LIMIT)
    assert (cause.kind, cause.node_index, cause.missing) == (CauseKind.UNRESPONSIVE, 2, ())
    assert cause.summary == ("node 2 (host2) sent no heartbeat for 8s (heartbeat_timeout=8s): "
                             "frozen or cut off from the network")


def test_two_nodes_the_only_peer_silent_names_both_sides():
    cause = silence_cause({0: LIVE, 1: 8.2}, hosts(2), LIMIT)
    assert cause.kind is CauseKind.UNRESPONSIVE and cause.node_index is None and cause.missing == (1,)
    assert cause.summary.startswith("lost contact between node 0 (the control, host0) and node 1 (host1): ")
    assert cause.summary.endswith("either node is cut off from the network, or node 1 is frozen")
    assert "likely" not in cause.summary


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_every_worker_silent_at_once_says_the_control_is_likely_cut_off(workers):
    quiet = {0: LIVE, **{n: 8.1 + 0.05 * n for n in range(1, workers + 1)}}
    cause = silence_cause(quiet, hosts(workers + 1), LIMIT)
    assert cause.kind is CauseKind.UNRESPONSIVE and cause.node_index is None
    assert cause.missing == tuple(range(1, workers + 1))
    assert cause.summary.startswith("lost contact between node 0 (the control, host0) and all %d other nodes at once"
                                    % workers)
    assert cause.summary.endswith("node 0 is likely the one cut off from the network")
    assert "sent no heartbeat" not in cause.summary  # no worker blamed


def test_the_others_just_short_of_the_timeout_fell_silent_with_the_first():
    """The check runs every quarter second: when the first passes the timeout,
    the others of the same cut are a fraction of a second behind it."""
    cause = silence_cause({0: LIVE, 1: 8.05, 2: 7.9, 3: 7.85}, hosts(4), LIMIT)
    assert "likely the one cut off" in cause.summary


def test_workers_that_went_silent_at_different_times_are_not_one_cut():
    """Node 1 froze first; node 2 only lately: node 1 is named alone."""
    cause = silence_cause({0: LIVE, 1: 8.2, 2: LIMIT * TOGETHER - 0.5}, hosts(3), LIMIT)
    assert cause.node_index == 1 and cause.summary.startswith("node 1 (host1) sent no heartbeat")


def test_several_silent_together_while_others_answer_are_named_together():
    cause = silence_cause({0: LIVE, 1: 8.2, 2: 8.1, 3: LIVE, 4: LIVE}, hosts(5), LIMIT)
    assert cause.node_index == 1 and cause.missing == (1, 2)
    assert cause.summary.startswith("nodes 1, 2 (host1, host2) sent no heartbeat for 8s")
    assert "while the others still answer" in cause.summary


def test_nodes_that_left_or_never_joined_are_not_counted():
    """Only connected nodes still in their step are passed: a gang of 4 whose
    nodes 2 and 3 left, node 1 silent, is the two-node case."""
    cause = silence_cause({0: LIVE, 1: 9.0}, hosts(4), LIMIT)
    assert cause.summary.startswith("lost contact between node 0 (the control, host0) and node 1 (host1)")


def test_a_silent_control_is_named_as_itself():
    cause = silence_cause({0: 8.5, 1: LIVE}, hosts(2), LIMIT)
    assert cause.node_index == 0 and cause.summary.startswith("node 0 (host0) sent no heartbeat")


def test_thousands_of_silent_nodes_stay_one_short_line():
    n = 4096
    quiet = {0: LIVE, **{i: 8.1 for i in range(1, n)}}
    cause = silence_cause(quiet, hosts(n), LIMIT)
    assert "all 4095 other nodes at once (nodes 1-4095: " in cause.summary and len(cause.summary) < 300
    half = {0: LIVE, **{i: (8.1 if i % 2 else LIVE) for i in range(1, n)}}
    cause = silence_cause(half, hosts(n), LIMIT)
    assert "and 2044 more" in cause.summary and len(cause.summary) < 400
