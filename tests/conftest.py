"""Shared test set-up.

Metaflow must be imported before our modules: importing Metaflow loads its
extensions, including ours, and importing ours first would be circular.

The markers that sort the suite into its two pools are given here, in one
place (``pytest_collection_modifyitems`` below; docs/development.md says how
the suite is run).
"""

import json
import os
import re
import resource
import time
from typing import Dict, List, Mapping, Optional

os.environ.setdefault("METAFLOW_USER", "tests")

import metaflow  # noqa: E402,F401
import pytest  # noqa: E402

# -- the pools (issue 50) -------------------------------------------------------------
# `make test` runs two pytest processes at once (tools/pools.py): tests marked
# `waits` at 4 workers, the rest at 3. A test belongs here when it mostly waits, 5 s
# or more of its wall time on the gang's own timeouts, a save, a silence or a
# socket, for little CPU; and only when its assertions hold however late it is
# woken (bounds of tens of seconds, or none): a test whose pass depends on a margin
# of a few seconds stays in the CPU-bound pool even if it waits (see KEPT_IN_THE_CPU_POOL's comment).
# Unit files were measured one at a time with /usr/bin/time on the shared 2-core
# machine, at load averages of 5 to 11 (wall s / CPU s of the whole file, about
# 1.8 CPU-s of it pytest's start). A pure-CPU file run beside them
# (test_options_hostile.py) took 1.8 to 3.5 times its CPU time, by the load; each
# file here waits 5 s or more beyond that (its wall less that factor times its CPU;
# test_stop.py, 7.2 s / 1.9 CPU-s, waits about 4 s and is not here). Flows were
# read, not run: the scenario's wait is by design. A key is a file, or a node id
# (which also covers its parameters).
WAITS = {
    # unit: real sockets, threads and child processes that wait out timings
    "tests/unit/test_gang.py": "64.6 s / 3.0 CPU-s: the gang service's heartbeats, grace and timeouts",
    "tests/unit/test_supervisor.py": "27.8 s / 6.6 CPU-s: a graceful stop's grace, children killed late",
    "tests/unit/test_gang_hostile.py": "20.3 s / 2.4 CPU-s: slow clients, back-offs, idle CPU checks",
    "tests/unit/test_gang_probe.py": "15.9 s / 2.1 CPU-s: stalled connections ridden out",
    "tests/unit/test_session.py": "13.8 s / 5.2 CPU-s (factor 1.8): linger and join waits (3 s each)",
    "tests/unit/test_local_nodes.py": "13.0 s / 1.9 CPU-s: node processes that outlive their caller",
    "tests/unit/test_stacks.py": "10.7 s / 4.3 CPU-s (factor 1.8): ranks asked for stacks, stopped ones waited out",
    # integration: a real flow (about 15 CPU-s to start) that then waits by design
    "tests/integration/test_gang_stop.py": "a 34 s and an 8 s save, each with 11-12 s of grace to spare",
    "tests/integration/test_progress.py": "16 s of paced steps; wait.py 12 s",
    "tests/integration/test_stops.py::test_a_function_entrypoints_stacks":
        "hang_timeout=20; its ranks talk until the quiet wait, nothing timed",
    "tests/integration/test_stops.py::test_sigterm_gives_the_ranks_time_to_save_a_checkpoint":
        "a 5 s save; bound 60 s",
    "tests/integration/test_stops.py::test_hang_timeout_names_the_rank_that_skipped_a_collective":
        "hang_timeout=20; ranks talk while they start, nothing timed",
    "tests/integration/test_card_attempts.py::test_a_hangs_card_names_the_suspect_as_the_console_does":
        "hang_timeout=20, as the one above",
    "tests/integration/test_preflight.py::test_a_node_that_hangs_in_the_preflight_job_is_named_within_heartbeat_timeout":
        "heartbeat_timeout=20; bound 110 s",
    "tests/integration/test_local_flows.py::test_timeout_decorator_stops_everything":
        "@timeout(seconds=25) over an idle loop; bound 150 s",
    "tests/integration/test_observability.py::test_control_reports_who_is_missing_at_a_call":
        "3 progress lines of one every 2 s, then node 1 is let reach the call; nothing timed",
    "tests/integration/test_observability.py::"
    "test_card_every_rank_of_every_node_has_an_exit_and_a_duration_when_the_gang_stops_them":
        "hang_timeout=10; nothing timed",
    "tests/integration/test_step_gang.py::test_a_node_that_never_starts_is_named_after_start_timeout":
        "start_timeout=8; nothing timed",
    "tests/integration/test_local_exposure.py::test_local_run_listens_on_loopback_only_and_loads_no_planted_pickle"
    "[static]": "a fixed 7 s for c10d's agents to read a planted pickle back",
    "tests/integration/test_gang_failures.py::test_frozen_node_is_detected_by_heartbeat":
        "heartbeat_timeout=6; bound 96 s",
    "tests/multihost/test_gang_stop.py::test_one_hosts_sigterm_saves_every_ranks_collective_checkpoint":
        "an 8 s save with 12 s of grace to spare",
    "tests/integration/test_slow_rank.py": "2 calls of 55 s (DDP, FSDP2) and 300 s of steps that mostly sleep; "
                                            "bound 45 s for a naming",
    "tests/integration/test_node_departures.py": "heartbeat_timeout=5 of a frozen node's silence, 12 to 48 s of "
        "DDP steps that mostly sleep (a node's task started again meanwhile); nothing timed",
    "tests/multihost/test_lost_pod.py": "63 s / 18 CPU-s: start_timeout=30 from the loss, then a task's store held "
                                        "until the control says it waits; nothing timed",
    "tests/multihost/test_lost_host.py::test_a_host_cut_off_for_good_is_replaced_by_the_spare":
        "heartbeat_timeout=8, then start_timeout=30 from the loss; nothing timed",
}
# KEPT_IN_THE_CPU_POOL (not marked; read, and left in the CPU-bound pool on purpose): they
# wait, but pass only within a few seconds' margin, which more workers could eat.
#   tests/integration/test_stops.py::test_a_rank_stuck_in_a_collective_shows_where_when_the_control_freezes
#       heartbeat_timeout=5 must fire within a fixed 9 s
#   tests/integration/test_stops.py::test_hang_timeout_stops_a_silent_gang_with_every_ranks_stack
#       stopped within hang_timeout + 5 s of the last line, stacks within 3 s
#   tests/multihost/test_network_faults.py: stops within heartbeat_timeout + 6 s and + 15 s, flaps
#       of 5 s under heartbeat_timeout=8, the start-up cut ended by start_timeout + 15 s
#   tests/multihost/test_gang_stop.py::test_a_spot_notice_from_metaflows_own_monitor_stops_the_gang_gracefully
#       ranks told within 10.5 s of the notice
#   tests/unit/test_gang_scale_harness.py: 8 clients in 2 processes must not miss a 1 s heartbeat
#   tests/integration/test_first_hour.py: 7 shared runs, one of which waits 60 s beside the others: CPU-bound in all

# `slow`: waits 20 s or more by design (`make test-fast` leaves these out).
SLOW = {
    "tests/integration/test_gang_stop.py::test_one_nodes_sigterm_gives_every_rank_the_configured_grace": "34 s save",
    "tests/integration/test_stops.py::test_a_function_entrypoints_stacks": "20 s silence",
    "tests/integration/test_stops.py::test_hang_timeout_names_the_rank_that_skipped_a_collective": "20 s silence",
    "tests/integration/test_card_attempts.py::test_a_hangs_card_names_the_suspect_as_the_console_does": "20 s silence",
    "tests/integration/test_preflight.py::test_a_node_that_hangs_in_the_preflight_job_is_named_within_heartbeat_timeout":
        "heartbeat_timeout=20",
    "tests/integration/test_local_flows.py::test_timeout_decorator_stops_everything": "@timeout(seconds=25)",
    "tests/multihost/test_network_faults.py::test_a_flap_that_tcp_would_stretch_past_the_timeout_is_ridden_out":
        "a 20 s cut",
    "tests/multihost/test_network_faults.py::test_start_up_cut": "start_timeout=30",
    "tests/integration/test_slow_rank.py": "2 x 55 s and 300 s of training",
    "tests/integration/test_node_departures.py::"
    "test_with_a_spare_a_frozen_node_is_swapped_out_and_back_then_a_spot_notice_swaps_another": "48 s of steps",
    "tests/integration/test_node_departures.py::"
    "test_with_min_nodes_a_frozen_node_is_left_behind_and_grows_back_then_a_sigterm_shrinks_the_gang": "48 s of steps",
}

# Every test under these folders has the folder's marker (`-m "not integration"`: unit tests).
FOLDER_MARKS = {"tests/integration/": "integration", "tests/multihost/": "multihost"}


def listed(nodeid: str, table) -> bool:
    """Whether ``nodeid`` is in ``table``: its file, the test, or one of its parameters."""
    return any(nodeid == key or nodeid.startswith((key + "::", key + "[")) for key in table)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: it must see these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        for folder, mark in FOLDER_MARKS.items():
            if item.nodeid.startswith(folder):
                item.add_marker(mark)
        if listed(item.nodeid, WAITS):
            item.add_marker("waits")
        if listed(item.nodeid, SLOW):
            item.add_marker("slow")


# -- a skip for want of the machine fails where the machine must have it -------------
# Tests that need root, network namespaces (iproute2's `ip` and `tc`, util-linux's `unshare`),
# a second user (`useradd`), a tmpfs mount or Chromium skip without them, saying so: a
# laptop runs the rest. CI (.ci/run) installs and has all of them, and sets MFTR_REQUIRE_MACHINE=1,
# under which such a skip is a failure with its reason: a test that silently stopped running
# there would guard nothing. A skip says what it lacks in its reason; these words mark one.
REQUIRE_MACHINE = "MFTR_REQUIRE_MACHINE"
MACHINE_WORDS = re.compile(r"\broot\b|namespace|iproute2|\bip\b|\btc\b|unshare|useradd|tmpfs|chromium", re.I)


def machine_skip_failure(reason: str, env: Mapping[str, str]) -> Optional[str]:
    """The failure a skip for want of the machine becomes under ``REQUIRE_MACHINE=1``; None otherwise."""
    if env.get(REQUIRE_MACHINE) != "1" or not MACHINE_WORDS.search(reason):
        return None
    return "skipped for want of the machine, where %s=1 requires it: %s" % (REQUIRE_MACHINE, reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipif mark's skip comes at set-up, so it fails as an error there; ``pytest.skip`` as a failure."""
    report = (yield).get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        failure = machine_skip_failure(reason, os.environ)
        if failure is not None:
            report.outcome, report.longrepr = "failed", failure


# -- the order each worker is given (issue 50) ----------------------------------------
# pytest-xdist's worksteal gives each worker a contiguous share of the collection, then
# idle workers steal the second half of the longest queue. In file order the real flows
# and hosts (integration, then multihost) fell into one or two shares and the unit tests
# into the rest, so the multi-host tests, 60 s flaps among them, ran last, one after
# another, while the other workers had nothing left: a 2-minute tail at under one core
# (tools/timeline.py). So each share starts with its part of the long files (a file kept
# whole for its module fixtures; the longest dealt first, each to the share with the
# fewest seconds so far, by tests/durations.json) and ends with short tests, which are
# what a thief takes.
LONG_FOLDERS = ("tests/integration/", "tests/multihost/")
LONG_FILE = 5.0  # seconds: a file this long anywhere is dealt too
DURATIONS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def read_durations(path: str = DURATIONS_FILE) -> Dict[str, float]:
    """Each test of a second or more and its seconds in a past run (``tools/timeline.py --write``).
    Stale numbers only deal less evenly."""
    try:
        with open(path) as f:
            return {str(k): float(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def shares(total: int, workers: int) -> List[int]:
    """The sizes of xdist's first shares: each worker in turn takes the pending
    tests divided by the workers still to be served (``WorkStealingScheduling``)."""
    sizes = []
    for k in range(workers):
        size = total // (workers - k)
        sizes.append(size)
        total -= size
    return sizes


def dealt(items: list, workers: int, seconds: Dict[str, float]) -> list:
    """The items in the order that gives each worker's share its part of the long files first."""
    files: Dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    # A test not in the table took under a second: a second in the long folders, nothing elsewhere.
    length = {name: sum(seconds.get(i.nodeid, 1.0 if name.startswith(LONG_FOLDERS) else 0.0) for i in tests)
              for name, tests in files.items()}
    long_files = [n for n in files if n.startswith(LONG_FOLDERS) or length[n] >= LONG_FILE]  # in file order: every worker deals the same
    short = [item for n, tests in files.items() if n not in long_files for item in tests]
    heads: List[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for name in sorted(long_files, key=lambda n: -length[n]):
        k = min(range(workers), key=lambda j: (load[j], len(heads[j])))
        heads[k].extend(files[name])
        load[k] += length[name]
    ordered: list = []
    for k, size in enumerate(shares(len(items), workers)):
        room = max(0, size - len(heads[k]))
        ordered.extend(heads[k] + short[:room])
        short = short[room:]
    return ordered + short


class _Dealer:
    """A plugin of its own: this file's pytest_collection_modifyitems runs before -m deselects."""

    @pytest.hookimpl(trylast=True)  # after -m has deselected: what this pool's workers will share
    def pytest_collection_modifyitems(self, config, items):
        workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
        if workers > 1:
            items[:] = dealt(items, workers, read_durations())


def pytest_configure(config):
    config.pluginmanager.register(_Dealer(), "mftr-dealer")


# -- the timeline (`--timeline DIR`: tools/pools.py gives it; tools/timeline.py reads it) --
# One line a test: when it began and ended, in which worker, and the CPU it cost (the worker's
# own and its reaped children's: a flow's runtime reaps its tasks, each task its ranks). What a
# pool's workers did when, and what the CPU went on, so that either can be seen, not guessed.
def pytest_addoption(parser):
    parser.addoption("--timeline", default="", help="a folder: each worker writes when each of its tests ran")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = item.config.getoption("--timeline", default="")  # none where this file was not an initial conftest
    began, cpu = time.time(), _cpu_seconds()
    yield
    if folder:
        # xdist's own id, not its environment variable, which a test's own pytest inherits.
        worker = getattr(item.config, "workerinput", {}).get("workerid", "main")
        with open(os.path.join(folder, "%s.tsv" % worker), "a") as f:
            f.write("%.3f\t%.3f\t%s\t%.2f\n" % (began, time.time(), item.nodeid, _cpu_seconds() - cpu))


def _cpu_seconds() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))
