"""retention.py: which runs' per-rank logs a host keeps (issue 28, item 4).

The policy is a pure function of each run's metadata and the time, so it is
tested here exhaustively: the cases by name, then invariants over many random
hosts. The directories themselves are tests/unit/test_workdirs.py's."""

from __future__ import annotations

import random

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host.retention import (
    HOUR,
    Measured,
    Removal,
    RetentionPolicy,
    RunLogs,
    format_ledger,
    is_recent,
    is_run_name,
    is_young,
    parse_ledger,
    select_removals,
)

NOW = 1_800_000_000.0
MB = 1024 * 1024
DEFAULT = RetentionPolicy(keep=20, hours=72, max_bytes=500 * MB)


def run(name, hours_ago, size=1000):
    return RunLogs(name, NOW - hours_ago * HOUR, size)


def removed(runs, policy=DEFAULT, protected=frozenset(), now=NOW):
    return [r.run.name for r in select_removals(runs, now, policy, protected)]


class TestTheIssuesScenario:
    def test_a_run_survives_30_other_flows_runs_within_the_age(self):
        """Run A an hour ago, then 30 runs of other flows on the same host: with
        20 kept by count (what the host did before), A was gone within the hour."""
        a = run("A-1", hours_ago=1)
        others = [run("Other%d-%d" % (i, i), hours_ago=1 - (i + 1) / 40) for i in range(30)]
        assert removed([a] + others) == []

    def test_and_goes_once_older_than_the_age_and_beyond_the_newest(self):
        a = run("A-1", hours_ago=73)
        others = [run("Other-%d" % i, hours_ago=i / 10) for i in range(30)]
        assert removed([a] + others) == ["A-1"]

    def test_the_newest_runs_are_kept_past_the_age(self):
        a = run("A-1", hours_ago=500)
        others = [run("Other-%d" % i, hours_ago=100 + i) for i in range(19)]
        assert removed([a] + others) == []  # 20 runs: A is the 20th newest
        assert removed([a] + others + [run("New-1", 0.5)]) == ["A-1"]


class TestAgeAndCount:
    def test_beyond_the_age_only_the_newest_keep_stay_oldest_removed_first(self):
        runs = [run("r%d" % i, hours_ago=100 + i) for i in range(6)]
        policy = RetentionPolicy(keep=2, hours=72, max_bytes=1 << 40)
        assert removed(runs, policy) == ["r2", "r3", "r4", "r5"]

    def test_recent_runs_count_in_the_newest(self):
        runs = [run("new%d" % i, hours_ago=i) for i in range(3)] + [run("old%d" % i, 80 + i) for i in range(2)]
        assert removed(runs, RetentionPolicy(keep=2, hours=72, max_bytes=1 << 40)) == ["old0", "old1"]
        assert removed(runs, RetentionPolicy(keep=4, hours=72, max_bytes=1 << 40)) == ["old1"]

    def test_zero_hours_is_a_bound_by_count_alone(self):
        runs = [run("r%d" % i, hours_ago=1 + i) for i in range(5)]
        assert removed(runs, RetentionPolicy(keep=3, hours=0, max_bytes=1 << 40)) == ["r3", "r4"]

    def test_nothing_kept_but_what_is_pinned(self):
        runs = [run("r%d" % i, hours_ago=1 + i) for i in range(3)] + [run("young", 0.01)]
        policy = RetentionPolicy(keep=0, hours=0, max_bytes=1 << 40)
        assert removed(runs, policy, protected={"r1"}) == ["r0", "r2"]

    def test_the_boundary_of_the_age(self):
        policy = RetentionPolicy(keep=0, hours=72, max_bytes=1 << 40)
        assert removed([run("just", hours_ago=72 - 1e-6)], policy) == []
        assert removed([run("past", hours_ago=72)], policy) == ["past"]

    def test_ties_are_broken_by_name_so_every_node_agrees(self):
        runs = [RunLogs(n, NOW - 100 * HOUR, 1) for n in ("c", "a", "b")]
        assert removed(runs, RetentionPolicy(keep=1, hours=72, max_bytes=1 << 40)) == ["b", "c"]


class TestPinned:
    def test_a_young_run_is_never_removed(self):
        policy = RetentionPolicy(keep=0, hours=0, max_bytes=0, young_seconds=120)
        young = RunLogs("young", NOW - 119, 10**9)
        assert removed([young], policy) == []
        assert removed([RunLogs("older", NOW - 121, 10)], policy) == ["older"]

    def test_a_clock_a_little_behind_is_young_a_stamp_far_ahead_is_not(self):
        policy = RetentionPolicy(keep=0, hours=1, max_bytes=0)
        assert is_young(RunLogs("x", NOW + 60, 1), NOW, policy)
        far = RunLogs("far", NOW + 10 * HOUR, 10)
        assert not is_young(far, NOW, policy) and is_recent(far, NOW, policy)
        assert select_removals([far], NOW, policy) == [Removal(far, for_space=True, recent=True)]

    def test_a_protected_run_counts_in_the_size_but_is_never_removed(self):
        busy = run("busy", hours_ago=500, size=900)
        other = run("other", hours_ago=1, size=200)
        policy = RetentionPolicy(keep=10, hours=72, max_bytes=1000)
        assert removed([busy, other], policy, protected={"busy"}) == ["other"]

    def test_everything_pinned_and_over_the_bound_removes_nothing(self):
        runs = [RunLogs("a", NOW - 10, 10**9), RunLogs("b", NOW - 5000, 10**9)]
        assert removed(runs, RetentionPolicy(keep=0, hours=0, max_bytes=0), protected={"b"}) == []


class TestSpace:
    def test_least_recently_used_first_until_under_the_bound(self):
        runs = [run("r%d" % i, hours_ago=i + 1, size=100) for i in range(5)]
        got = select_removals(runs, NOW, RetentionPolicy(keep=20, hours=72, max_bytes=250))
        assert [(r.run.name, r.for_space, r.recent) for r in got] == [
            ("r4", True, True), ("r3", True, True), ("r2", True, True)]

    def test_old_runs_go_by_count_first_and_space_takes_the_rest(self):
        runs = [run("recent", 1, size=400), run("mid", 2, size=400), run("old", 100, size=400)]
        got = select_removals(runs, NOW, RetentionPolicy(keep=1, hours=72, max_bytes=500))
        assert [(r.run.name, r.for_space, r.recent) for r in got] == [("old", False, False), ("mid", True, True)]

    def test_under_the_bound_nothing_goes_for_space(self):
        runs = [run("r%d" % i, hours_ago=i + 1, size=100) for i in range(5)]
        assert removed(runs, RetentionPolicy(keep=20, hours=72, max_bytes=500)) == []

    def test_an_old_run_kept_by_count_goes_for_space_and_is_not_called_recent(self):
        got = select_removals([run("old", 100, size=10)], NOW, RetentionPolicy(keep=5, hours=72, max_bytes=5))
        assert got == [Removal(run("old", 100, size=10), for_space=True, recent=False)]


def _random_host(rng):
    runs = []
    for i in range(rng.randint(0, 40)):
        hours_ago = rng.choice([rng.uniform(-0.1, 0.1), rng.uniform(0, 5), rng.uniform(60, 80),
                                rng.uniform(80, 1000), 72.0])
        runs.append(RunLogs("r%d" % i, NOW - hours_ago * HOUR, rng.choice([0, 1, 10, 1000, 10**6])))
    policy = RetentionPolicy(keep=rng.randint(0, 25), hours=rng.choice([0, 1, 72]),
                             max_bytes=rng.choice([0, 100, 10**5, 10**7, 10**12]),
                             young_seconds=rng.choice([0, 120]))
    protected = {r.name for r in runs if rng.random() < 0.15}
    return runs, policy, protected


@pytest.mark.parametrize("seed", range(300))
def test_invariants_on_random_hosts(seed):
    rng = random.Random(seed)
    runs, policy, protected = _random_host(rng)
    got = select_removals(runs, NOW, policy, protected)
    gone = {r.run.name for r in got}
    assert len(gone) == len(got), "a run is removed once"
    newest_first = sorted(runs, key=lambda r: (-r.last_used, r.name))
    rank = {r.name: i for i, r in enumerate(newest_first)}

    def pinned(r):
        return r.name in protected or is_young(r, NOW, policy)

    for r in got:
        assert not pinned(r.run), "a run in use or just made is never removed"
        assert r.recent == is_recent(r.run, NOW, policy)
        if not r.for_space:
            assert rank[r.run.name] >= policy.keep and not r.recent, "age and count: only old runs beyond the newest"
    left = [r for r in runs if r.name not in gone]
    total = sum(r.size for r in left)
    assert total <= policy.max_bytes or all(pinned(r) for r in left), "over the bound only when nothing left may go"
    for r in left:
        assert pinned(r) or rank[r.name] < policy.keep or is_recent(r, NOW, policy), "old runs beyond the newest go"
    space = [r.run for r in got if r.for_space]
    if space:
        assert [r.last_used for r in space] == sorted(r.last_used for r in space), "least recently used first"
        newest_gone = max(r.last_used for r in space)
        assert all(pinned(r) or r.last_used >= newest_gone for r in left), "never a more recent run before an older"
        assert total + space[-1].size > policy.max_bytes, "no run goes for space once under the bound"


class TestLedger:
    def test_round_trip(self):
        entries = {"Flow-1": Measured(5, 1_700_000_000_123_456_789, 42), "G-argo-x": Measured(1, 2, 0)}
        assert parse_ledger(format_ledger(entries)) == entries

    @pytest.mark.parametrize("line", [
        "Flow-1\t5\t6",  # a field short
        "Flow-1\t5\t6\t7\t8",
        "Flow-1\t-5\t6\t7",
        "Flow-1\tx\t6\t7",
        "Flow-1\t\u0661\t6\t7",  # a digit, but not ASCII
        "../etc\t1\t2\t3",
        ".ledger\t1\t2\t3",
        "\t1\t2\t3",
    ])
    def test_a_bad_line_is_skipped_and_the_rest_read(self, line):
        assert parse_ledger(line + "\nFlow-2\t1\t2\t3\n") == {"Flow-2": Measured(1, 2, 3)}

    def test_names_that_cannot_be_written_are_left_out(self):
        assert format_ledger({"a\tb": Measured(1, 2, 3), "a\nb": Measured(1, 2, 3), ".x": Measured(1, 2, 3)}) == ""

    @pytest.mark.parametrize("name, ok", [("Flow-1", True), ("", False), (".hidden", False), ("..", False),
                                          ("a/b", False), ("a\0b", False)])
    def test_run_names(self, name, ok):
        assert is_run_name(name) is ok
