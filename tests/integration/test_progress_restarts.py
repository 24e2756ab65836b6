"""What the gang says of its pace after a restart and after a swap: rates that
start again with each start of the ranks, and no node named for the time its
ranks were down. One real 3-node run (nproc 1, node 2 a spare), read by each
test: two nodes train in lockstep (an all-reduce a step, 0.1 s a step) and
resume from their checkpoint (3 s to load it); rank 0 (node 0) is SIGKILLed once, a restart in
place, then rank 1 (node 1), which swaps the spare in. Snapshots are off (``snapshots=False``): each
start's ranks ask ``snapshot.load()`` and resume from their own checkpoint.

Was: each rank's history outlived the restart, so its steps/s were measured
from the replaced rank's last report, the time down included (a curve rising
from 0 for 30 s), while the spare, with no history, looked fast: "slowest:
node 0 ... at 0.66x the median steps/s" of nodes that trained in lockstep."""

import json
import re
import statistics
from typing import Dict, Iterator, List, Optional

import pytest

from .calls import flow_run, once_per_pytest_run
from .helpers import Gang, without_task_prefix

pytestmark = pytest.mark.integration

STEPS = 270  # 9 s a start at 10 steps/s: a node's progress rides one heartbeat every 3 s
KILLS = "0:0:90,1:1:180"  # start 0: rank 0 after step 90; start 1: rank 1 after step 180
RESTART = "restarting every node's ranks (restart 1 of 2)"
SWAP = re.compile(r"node 1 \([^)]*\) taken out, spare node 2 \([^)]*\) brought in \(restart 2 of 2\)")
RATE = re.compile(r", ([0-9.e+]+) steps/s")
STEP = re.compile(r"progress: step (\d+)")
RESUMED = (90, 180)  # each restart's ranks resume from their checkpoint at the step the killed rank saved
NEAR = 0.2  # a rate after a restart at most 20 % below the rate before it (the first start's median line)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[dict]:
    def produce() -> dict:
        return flow_run(
            tmp_path_factory, "progress-restarts", "--script", "progress_restarts.py", "--nodes", "3",
            "--nproc", "1", "--script-args", json.dumps({"steps": STEPS, "every": 0.1, "kill": KILLS, "load": 3}),
            env={"MFTR_TORCHRUN_ATTRS": json.dumps({"restarts": 2, "spares": 1, "snapshots": False}),
                 "METAFLOW_TORCHRUN_PROGRESS_SECONDS": "1", "METAFLOW_TORCHRUN_STRAGGLER_SECONDS": "2",
                 "METAFLOW_TORCHRUN_STRAGGLER_RATIO": "1.3"})

    kept = once_per_pytest_run(tmp_path_factory, "progress-restarts", produce)
    kept["text"] = without_task_prefix(kept["text"])
    assert kept["returncode"] == 0, kept["text"][-5000:]
    yield kept


def _starts(text: str) -> List[List[str]]:
    """The control's progress lines, cut at the restart's line and at the swap's."""
    starts: List[List[str]] = [[]]
    for line in text.splitlines():
        if RESTART in line or SWAP.search(line):
            starts.append([])
        elif "@torchrun: progress: step" in line:
            starts[-1].append(line.split("@torchrun: ", 1)[1])
    assert len(starts) == 3, text[-5000:]
    return starts


def _rates(lines: List[str]) -> List[float]:
    return [float(m.group(1)) for m in map(RATE.search, lines) if m]


def _progress(run: dict) -> Dict[str, object]:
    record = Gang(run["tmp"]).client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])")
    return record["progress"]


def _not_held_down(rate: Optional[float], before: float) -> bool:
    """A start's first rate not held down by the time the ranks were down (the bug read 0.66x, a curve rising
    from 0: it shows first). Above is no bug: the first start has a line or two of rates before its kill, each
    of a young window that holds the ranks' first step (a loaded run read 7.65 steps/s there, 9.0 to 9.4 after
    the restart); later lines follow the machine's load (a CI run's fell from 8.5 to 4.6 steps/s as the run
    ended beside other flows), which is no restart's."""
    return rate is not None and rate >= (1.0 - NEAR) * before


def test_after_a_restart_in_place_the_rate_is_the_rate_before_and_no_node_is_named_slowest(run):
    starts = _starts(run["text"])
    before, after = _rates(starts[0]), _rates(starts[1])
    assert before and after, starts
    assert _not_held_down(after[0], statistics.median(before)), (before, starts[1])
    slowest = [line for lines in starts[:2] for line in lines if "slowest" in line]
    assert not slowest, slowest


def test_after_each_restart_no_line_goes_below_the_step_resumed_and_each_says_its_rate_or_that_it_is_measured(run):
    """Was: `progress: step 51/200 (26%), ETA 15 s` 0.9 s after `resumed at step 81` (the replaced ranks'
    sum, not said yet for the interval), and the new start's first line without ETA or steps/s."""
    for lines, resumed in zip(_starts(run["text"])[1:], RESUMED):
        steps = [int(STEP.search(line).group(1)) for line in lines]
        assert steps and min(steps) >= resumed, (resumed, lines)
        assert all(RATE.search(line) or "ETA and steps/s measuring..." in line for line in lines), lines


def test_snapshots_off_are_said_once_in_words_not_by_a_variable(run):
    """Every rank of every start calls load(): rank 0 of the first start says it, once."""
    said = [line for line in run["text"].splitlines() if "snapshots are off" in line]
    assert len(said) == 1 and "snapshots are off for this step (`@torchrun(snapshots=False)`)" in said[0], said
    assert "METAFLOW_TORCHRUN_SNAPSHOT" not in run["text"], run["text"][-3000:]


def test_after_a_swap_no_node_is_named_a_straggler_or_slowest(run):
    starts = _starts(run["text"])
    before, after = statistics.median(_rates(starts[0])), _rates(starts[2])
    assert after and _not_held_down(after[0], before), (before, starts[2])
    slowest = [line for line in starts[2] if "slowest" in line]
    assert not slowest, slowest
    named = [line for line in run["text"].splitlines() if "slower than the median" in line]
    assert not named, named
    progress = _progress(run)
    assert progress["stragglers"] == [] and progress["slowest"] is None, progress
    assert progress["step"] == STEPS and progress["steps_per_second"], (before, progress)


def test_the_ledger_keeps_the_work_the_ranks_checkpoint_kept_and_counts_the_load_as_the_restarts(run):
    """No snapshots: each start resumes from the script's checkpoint of every step, so its first report is the
    step after the one the replaced ranks died at. The ledger keeps their work up to then (it counted all of it
    lost), and the new start's 3 s load is the restart's, not training."""
    record = Gang(run["tmp"]).client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = (json.loads(t.metadata_dict['torchrun-result'])['in_step_restarts'],\n"
        "          json.loads(t.metadata_dict['torchrun-goodput']))")
    restarts, ledger = record
    assert len(restarts) == 2, restarts
    for r in restarts:
        assert r["failed_at"] - 2.0 <= r["kept_until"] <= r["failed_at"] and r["lost_work_seconds"] < 2.0, r
        assert r["trained_at"] >= r["ranks_at"] + 3.0, r  # the load (--load 3) before the first report
    segments = ledger["segments"]
    assert all(s["parts"]["lost_work"] < 2.0 for s in segments[:2]), segments
    assert all(s["parts"]["restart"] >= 3.0 for s in segments[1:3]), segments
    assert ledger["effective_percent"] > 50, ledger
