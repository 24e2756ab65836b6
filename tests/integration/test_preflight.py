"""@torchrun(preflight=...) in real flows: a node with other software is refused
before any rank starts; a small /dev/shm is warned about; preflight="full" runs
its collective job at 2 nodes x 2 processes and shows bandwidth in the card; a
node that hangs in that job is named within heartbeat_timeout."""

import json
import os
import subprocess
import time

import pytest

from .helpers import output, without_task_prefix
from .test_observability import _card_components

pytestmark = pytest.mark.integration


def _record(gang):
    return gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )


def _rank_reports(gang):
    return [n for n in os.listdir(gang.out) if n.startswith("rank-")]


def test_a_node_with_another_torch_is_refused_before_any_rank_starts(gang):
    proc = gang.run("--script", "report.py", env={"METAFLOW_TORCHRUN_FAKE_FINGERPRINT_TORCH": "1=2.12.0"})
    text = without_task_prefix(output(proc))
    assert proc.returncode != 0, text[-3000:]
    assert "preflight refused the gang before any rank started: torch: node 1 has 2.12.0 (tied; the reference is node 0's, 2.13" in text, \
        text[-3000:]
    assert "Fix: build every node from one image" in text
    assert not _rank_reports(gang), "a rank started"  # report.py writes one file per rank
    # No rank ran: no rank's output to point at.
    assert "Every rank's output" not in text and "output, whole" not in text, text[-3000:]
    record = _record(gang)
    assert record["cause"]["kind"] == "preflight" and record["cause"]["node_index"] == 1
    pre = record["preflight"]
    assert pre["mode"] == "versions" and pre["reported"] == 2
    assert [g["nodes"] for g in pre["versions"]["torch"]] == [[0], [1]]
    assert pre["differences"][0].startswith("torch: node 1 has 2.12.0")


def test_the_default_mode_passes_and_records_every_node(calls_run):
    # calls.CALLS, in one step: the preflight is the step's, kept in its last call's record.
    gang = calls_run.gang
    assert calls_run.returncode == 0, calls_run.text[-3000:]
    assert len(calls_run.reports("report", "rank-")) == 4
    pre = _record(gang)["preflight"]
    assert pre["mode"] == "versions" and pre["reported"] == 2 and not pre["differences"]
    assert sorted(row["node"] for row in pre["rows"]) == [0, 1]
    assert {"shm", "disk", "network"} <= set(pre["rows"][0])
    assert "job" not in pre  # no collective job by default


def test_preflight_off_sends_nothing(gang):
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"preflight": False})
    proc = gang.run("--script", "report.py", "--nproc", "1", env={"METAFLOW_TORCHRUN_FAKE_FINGERPRINT_TORCH": "1=2.12.0"})
    assert proc.returncode == 0, output(proc)[-3000:]
    assert _record(gang)["preflight"] == {}


@pytest.fixture
def small_shm(tmp_path):
    """A real 64 MiB tmpfs (needs root): what a container's /dev/shm is."""
    path = str(tmp_path / "shm")
    os.makedirs(path)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", path], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], capture_output=True)


def test_a_small_dev_shm_is_warned_about_with_the_fix(gang, small_shm):
    # The node's processes as the step declares them (not a call's override).
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"nproc_per_node": 2})
    proc = gang.run("--script", "report.py", env={"METAFLOW_TORCHRUN_PREFLIGHT_SHM_PATH": small_shm})
    text = without_task_prefix(output(proc))
    assert proc.returncode == 0, text[-3000:]  # a warning, not a refusal
    assert ("@torchrun: preflight: shm on nodes 0, 1: found 64 MiB, expected at least 2048 MiB "
            "(1 GiB per process, 2 processes). Fix: raise it with @kubernetes(shared_memory=<MiB>) "
            "or @batch(shared_memory=<MiB>), e.g. shared_memory=2048") in text, text[-3000:]
    finding = _record(gang)["preflight"]["findings"][0]
    assert finding["name"] == "shm" and finding["status"] == "warn" and finding["nodes"] == [0, 1]


def test_full_runs_the_collective_job_and_shows_bandwidth_per_node(gang):
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"preflight": "full"})
    proc = gang.run("--script", "report.py", "--nproc", "1", timeout=400)
    text = without_task_prefix(output(proc))
    assert proc.returncode == 0, text[-3000:]
    assert "@torchrun: preflight: collective job (gloo) in " in text
    assert len(_rank_reports(gang)) == 2  # the user's call ran after it
    job = _record(gang)["preflight"]["job"]
    assert job["allreduce_ok"] and job["backend"] == "gloo" and job["busbw_gbps"] > 0
    assert set(job["init_s"]) == {"0", "1"} and set(job["link_gbps"]) == {"1"}
    components = json.dumps(_card_components(gang))
    assert "Preflight (full)" in components and "GB/s to node 0" in components
    assert '"type": "vegaChart"' in components or "vega" in components.lower()


def test_a_node_that_hangs_in_the_preflight_job_is_named_within_heartbeat_timeout(gang):
    timeout = 20.0
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"preflight": "full", "heartbeat_timeout": timeout})
    began = time.monotonic()
    proc = gang.run("--script", "report.py", "--nproc", "1", timeout=400,
                    env={"METAFLOW_TORCHRUN_FAKE_PREFLIGHT_HANG": "1"})
    took = time.monotonic() - began
    text = without_task_prefix(output(proc))
    assert proc.returncode != 0, text[-3000:]
    assert ("stopped: preflight job: node 1 did not get through its collectives within 20s "
            "(heartbeat_timeout): local rank ") in text
    assert "in 'ready', outside any collective, while its peers waited" in text, text[-4000:]
    assert not _rank_reports(gang)  # the user's call never started
    # The clock starts once the node's ranks have started: the flow's own
    # start (two tasks, torch imported by 2 ranks on 2 shared cores) comes on
    # top; the stop itself takes seconds.
    assert took < timeout + 90, took
    assert "in preflight_job: time.sleep(1)" in text  # where node 1's ranks were
