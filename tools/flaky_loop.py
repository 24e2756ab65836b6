"""The load loop (issue 50): the tests that flaked before, run again and again on
a loaded machine, to show that their causes are gone.

    python tools/flaky_loop.py [--times N] [--load L] [--timeout S] [NODE_ID ...]

Each test (``FLAKY`` below, or the node ids given) runs ``N`` times (default 5)
beside ``L - 2`` busy loops (``python -c 'while 1: pass'``; default ``L`` 8), so
that with the test's own work the load is about ``L`` (a flow keeps about 2
cores busy). They go round by round: one pytest per round runs every test once
(so a module's or session's shared run is run again each round, and a loop cut
short has covered every test as often as it could), loading this file as a
plugin that writes each test's outcome down. After each round the counts so
far are printed per test: passed, failed (naming the rounds) and how long its
call took.

The busy loops die with this process, whatever ends it: they are stopped in a
``finally`` (also on Ctrl-C and SIGTERM), and Linux kills them if this process
is killed first (``PR_SET_PDEATHSIG``). pytest runs in this process group, so a
terminal's Ctrl-C reaches it too; it is stopped if it outlives its round. Every
test already fails if it leaves a process behind (tests/conftest.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests that flaked, each with what it did (docs/development.md, "The load loop").
FLAKY: Dict[str, str] = {
    "tests/integration/test_restarts.py::test_a_rank_killed_twice_restarts_twice_in_the_same_tasks_and_resumes":
        "hung 300 s once in CI, failed 1 of 9 dev runs",
    "tests/integration/test_stops.py::test_a_function_entrypoints_stacks":
        "a rank's stack dump cut short (SIGSEGV in faulthandler); twice, no stacks: its worker's first test, it waited for the worker's warm process to import torch",
    "tests/integration/test_failure_screen.py::test_a_script_raising_shows_the_root_cause_once_in_one_screen":
        "132 lines once in CI: the echo node's agent got the gang's SIGTERM as it ended, and torch's handler raised in our ending",
    "tests/multihost/test_gang_stop.py::test_a_spot_notice_from_metaflows_own_monitor_stops_the_gang_gracefully":
        "the sidecar worker asserted gone before Metaflow's monitor signalled it",
    "tests/unit/test_flight.py::test_a_rank_blocked_in_a_collective_answers_with_what_its_recorder_holds":
        "gloo's recorder marked a returned all_reduce completed late; once never (its pg_status written out of order)",
    "tests/integration/test_own_torchrun.py":
        "'terminate called' (SIGABRT): gloo's threads left to the interpreter's finalization by a module-level DDP model",
    "tests/integration/test_trainer_snapshots.py::test_an_hf_trainers_snapshot_interval_is_chosen_from_a_saves_cost":
        "'terminate called' (SIGABRT) in the plain run its fixture makes: hf_snapshot.py's trainer at module level",
    "tests/unit/test_failure_report.py::TestRootCauseOrder::test_a_real_gloo_peer_loss_is_recognised":
        "a rank still in its barrier, outside its try, when its peer died",
    "tests/integration/test_stops.py::test_hang_timeout_stops_a_silent_gang_with_every_ranks_stack":
        "hang_timeout: silent start-up counted as the hang",
    "tests/integration/test_card_attempts.py::test_a_hangs_card_names_the_suspect_as_the_console_does":
        "hang_timeout: silent start-up counted as the hang",
    "tests/unit/test_stacks.py::TestCollect::"
    "test_a_rank_whose_other_thread_runs_python_survives_being_asked_again_and_again":
        "3 dumps read as one: the test's own queued asks, not yet answered by a starved rank",
    "tests/unit/test_stacks.py::TestCollect::test_a_dump_unfinished_at_the_bound_is_kept_and_says_so":
        "at a CI run's start the stand-in had not written the dump's first half within the 0.5 s bound",
    "tests/integration/test_observability.py::test_control_reports_who_is_missing_at_a_call":
        "node 1 not joined within start_timeout=9 under load (its task's start alone took longer)",
    "tests/integration/test_first_hour.py::test_a_gang_whose_nodes_disagree_on_their_calls_names_the_node_at_once":
        "\"late\" at start_timeout=5: node 1 did not join in time under load (3 of 3 beside a busy loop)",
    "tests/integration/test_observability.py::test_the_debug_channel_shows_the_gang_and_its_timing":
        "the control's service closed (every node had heard the verdict) before node 1's leave reached it",
    "tests/integration/test_trainer_progress.py::test_an_hf_trainer_reports_step_total_loss_and_learning_rate":
        "a step slower than a second: tqdm's bar read '1.01s/it]', which the test did not take for a rate",
    "tests/integration/test_slow_rank.py::test_a_slow_node_is_swapped_for_the_spare_and_the_gang_trains_at_its_pace_again":
        "the steps after the swap stretched by the load: a quarter-slow node's 1.25x read as 1.11x",
    "tests/integration/test_failure_screen.py::"
    "test_a_function_raising_fails_the_step_with_its_own_exception_in_one_screen":
        "the echoes were stopped (SIGTERM) before rank 1's closed sockets reached them: the test wanted the gloo error",
}
_PR_SET_PDEATHSIG = 1


# -- the plugin: loaded into each pytest this script starts (-p flaky_loop) -----------------


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--flaky-counts", default="", help="write every test's outcome here (JSON)")


def pytest_configure(config: Any) -> None:
    config._flaky_outcomes = []  # (test, outcome, the call's seconds) per phase that ran or failed
    _CONFIG[0] = config


def pytest_runtest_logreport(report: Any) -> None:
    """Every phase's outcome: a test fails by its set-up, its call or its
    teardown (a process left behind fails the teardown)."""
    config = _CONFIG[0]
    if config is not None and (report.when == "call" or report.outcome != "passed"):
        config._flaky_outcomes.append((report.nodeid, report.outcome,
                                       round(report.duration, 1) if report.when == "call" else None))


_CONFIG: List[Any] = [None]


def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("--flaky-counts")
    if path:
        with open(path, "w") as f:
            json.dump(session.config._flaky_outcomes, f)


# -- the loop -------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In a busy loop, before exec: SIGKILL when the loop's process dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def start_busy(count: int) -> List[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"], stdin=subprocess.DEVNULL,
                             preexec_fn=_die_with_parent) for _ in range(count)]


def stop_all(procs: Sequence[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is left ``grace`` seconds later; reap each."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def verdicts(outcomes: Sequence[Sequence[Any]]) -> Dict[tuple, str]:
    """(test, round) -> "failed" if any of its phases failed, else its call's outcome."""
    found: Dict[tuple, str] = {}
    for test, round_, outcome, *_seconds in outcomes:
        key = (test, round_)
        if found.get(key) != "failed":
            found[key] = outcome
    return found


def counts(outcomes: Sequence[Sequence[Any]]) -> Dict[str, Counter]:
    found: Dict[str, Counter] = {}
    for (test, _round), outcome in verdicts(outcomes).items():
        found.setdefault(test, Counter())[outcome] += 1
    return found


def report(outcomes: Sequence[Sequence[Any]], load: float) -> List[str]:
    """One line per test: passed, failed (with which rounds), and how long its call took."""
    by_test, decided = counts(outcomes), verdicts(outcomes)
    lines = ["load loop: %d busy loops (load about %g), %s" % (max(0, int(load) - 2), load,
                                                              time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))]
    for test in sorted(by_test):
        c = by_test[test]
        failed = sorted(r for (t, r), o in decided.items() if t == test and o == "failed")
        took = [o[3] for o in outcomes if o[0] == test and len(o) > 3 and o[3] is not None]
        lines.append("%3d passed %3d failed  %s%s%s" % (
            c["passed"], c["failed"], test, "  (%.0f-%.0f s)" % (min(took), max(took)) if took else "",
            "  (failed: round %s)" % ", ".join(map(str, failed)) if failed else ""))
    return lines


def run_round(tests: Sequence[str], round_: int, timeout: Optional[int], env: Dict[str, str]) -> List[list]:
    """One pytest over every test, once: each outcome with its round."""
    fd, out = tempfile.mkstemp(prefix="flaky-loop-", suffix=".json")
    os.close(fd)
    argv = [sys.executable, "-m", "pytest", "-p", "flaky_loop", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
            "-rf", "--flaky-counts", out, *(["--timeout", str(timeout)] if timeout else []), *tests]
    pytest = subprocess.Popen(argv, cwd=ROOT, env=env)
    try:
        pytest.wait()
    finally:
        stop_all([pytest])  # Ctrl-C: it had the signal too, and ends its test first
        try:
            with open(out) as f:
                text = f.read()
            os.remove(out)
        except OSError:
            text = ""
    return [[test, round_, *rest] for test, *rest in (json.loads(text) if text.strip() else [])]


def run(tests: Sequence[str], times: int, load: float, timeout: Optional[int]) -> int:
    """``times`` rounds beside the busy loops; the counts so far, however it ends."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                       os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    busy: List[subprocess.Popen] = []
    outcomes: List[list] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below runs
    try:
        busy = start_busy(max(0, int(load) - 2))
        for round_ in range(times):
            outcomes += run_round(tests, round_, timeout, env)
            print("\n" + "\n".join(report(outcomes, load)), flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_all(busy)
    return 0 if outcomes and not any(o == "failed" for o in verdicts(outcomes).values()) else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--times", type=int, default=5, help="runs of each test (default 5)")
    parser.add_argument("--load", type=float, default=8, help="the load to run at: L - 2 busy loops (default 8)")
    parser.add_argument("--timeout", type=int, default=None, help="pytest-timeout per test (default pytest.ini's)")
    parser.add_argument("tests", nargs="*", help="node ids (default: every test in FLAKY)")
    args = parser.parse_args(argv)
    return run(args.tests or list(FLAKY), args.times, args.load, args.timeout)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # pytest had the Ctrl-C too, and has said so; the loops are gone
        sys.exit(130)
