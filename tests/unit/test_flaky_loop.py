"""tools/flaky_loop.py: a test fails a round by any of its phases and counts
once per round, and busy loops are gone once stopped."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import flaky_loop  # noqa: E402


def test_a_round_fails_by_its_teardown_too_and_is_counted_once():
    outcomes = [("t", 0, "passed", 61.5), ("t", 0, "failed", None), ("t", 1, "passed", 90.2),
                ("u", 0, "failed", None), ("u", 1, "skipped", None)]
    assert flaky_loop.counts(outcomes) == {"t": {"passed": 1, "failed": 1}, "u": {"failed": 1, "skipped": 1}}
    assert flaky_loop.report(outcomes, 4)[1:] == ["  1 passed   1 failed  t  (62-90 s)  (failed: round 0)",
                                                  "  0 passed   1 failed  u  (failed: round 0)"]


def test_busy_loops_are_gone_once_stopped():
    busy = flaky_loop.start_busy(2)
    try:
        assert all(p.poll() is None for p in busy)
    finally:
        flaky_loop.stop_all(busy)
    assert all(p.returncode is not None for p in busy)
    assert not any(os.path.exists("/proc/%d" % p.pid) for p in busy)
