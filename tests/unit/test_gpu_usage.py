"""The GPUs' utilisation, the straggler signal without progress reports
(host/gpu_usage.py): nvidia-smi's CSV answer read as the real tool writes it,
the GPUs CUDA_VISIBLE_DEVICES names, and a tool that hangs or lies never
delays the node. The tool is a stand-in script: no GPU on this machine."""

from __future__ import annotations

import os
import stat
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.host import gpu_usage
from metaflow_extensions.torchrun.plugins.torchrun.host.gpu_usage import GpuUsage, mean_percent, parse_query, visible

# nvidia-smi --query-gpu=index,uuid,utilization.gpu --format=csv,noheader,nounits, as it prints it
ANSWER = """0, GPU-6f2c1a3e-0d4b-7a1e-93c8-5be2f1a0c111, 91
1, GPU-0b7d9c2e-11aa-4c3f-8e21-77d0a6b4c222, 88
2, GPU-9e1f0d3c-4b2a-4f6e-a1d7-3c8b2e5f4333, 12
3, GPU-2a4c6e8f-1b3d-4f5a-9c7e-0d2f4a6b8444, [N/A]
"""


def test_the_answer_is_read_line_by_line_and_what_is_not_a_percentage_is_left_out():
    gpus = parse_query(ANSWER + "garbage\n7, GPU-x, 250\n, , \n")
    assert [(i, p) for i, _, p in gpus] == [(0, 91.0), (1, 88.0), (2, 12.0)]
    assert parse_query("") == [] and parse_query("NVIDIA-SMI has failed") == []


@pytest.mark.parametrize("spec, expected", [
    (None, [91.0, 88.0, 12.0]),  # unset: every GPU
    ("", []),  # set empty: none (CUDA sees none)
    ("2,0", [12.0, 91.0]),
    ("GPU-9e1f0d3c,1", [12.0, 88.0]),  # a UUID prefix, as CUDA accepts it
    ("1,7,0", [88.0]),  # CUDA stops at the first entry it cannot resolve
    ("GPU-", []),  # a prefix of every GPU names none
])
def test_only_the_gpus_the_task_sees_count(spec, expected):
    assert visible(parse_query(ANSWER), spec) == expected


def test_the_mean_of_the_visible_gpus():
    assert mean_percent(ANSWER, "0,2") == 51.5 and mean_percent(ANSWER, "3") is None


def _tool(tmp_path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_thread_asks_the_tool_and_the_heartbeat_reads_the_last_answer(tmp_path):
    args = tmp_path / "args"
    tool = _tool(tmp_path, 'echo "$@" > %s\ncat <<EOF\n%sEOF\n' % (args, ANSWER))
    with GpuUsage({"CUDA_VISIBLE_DEVICES": "1,2"}, every=0.05, tool=tool) as usage:
        deadline = time.monotonic() + 10
        while usage.latest() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert usage.latest() == 50.0
    assert args.read_text().split() == gpu_usage.QUERY


def test_an_answer_goes_stale_when_the_tool_stops_answering(tmp_path):
    usage = GpuUsage({}, every=0.05, tool=_tool(tmp_path, "exit 9\n"))
    assert usage.ask() is None
    usage._latest = (time.monotonic() - 1.0, 90.0)  # more than 3 * every ago
    assert usage.latest() is None


def test_a_hung_tool_is_abandoned_after_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(timeouts, "GPU_QUERY_TIMEOUT", 0.3)
    usage = GpuUsage({}, tool=_tool(tmp_path, "exec sleep 30\n"))
    began = time.monotonic()
    assert usage.ask() is None
    assert time.monotonic() - began < 5


def test_without_the_tool_no_thread_runs(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    usage = GpuUsage(os.environ)
    assert usage.tool is None
    with usage:
        assert usage.latest() is None
