"""The gang scale harness (benchmarks/gang_scale.py) works end to end: a real
service, 8 real clients in two worker processes and one frozen node, short
phases. No timing is asserted: only that every phase measured something and
that every process the harness started is gone."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

import metaflow  # noqa: F401  (must come before our modules)
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))

import gang_scale  # noqa: E402
from proc_helpers import is_running  # noqa: E402


class Seen(list):
    """The harness's list of live workers, remembering every one ever added."""

    def __init__(self):
        super().__init__()
        self.pids = []

    def append(self, proc):
        self.pids.append(proc.pid)
        super().append(proc)


def test_the_harness_measures_every_phase_at_8_nodes(tmp_path, monkeypatch):
    out = tmp_path / "gang_scale.json"
    seen = Seen()
    monkeypatch.setattr(gang_scale, "_LIVE", seen)
    try:
        rows = gang_scale.main(["--nodes", "8", "--workers", "2", "--idle", "2.5", "--settle", "0.2",
                                "--join-bound", "30", "--frozen-heartbeat-timeout", "1", "--verdict-bound", "10",
                                "--label", "test", "--progress", "on", "--out", str(out)])
    finally:
        gang_scale.kill_all()
    pids = seen.pids
    assert len(pids) == 3 and not any(is_running(p) for p in pids)
    assert not multiprocessing.active_children()
    (row,) = rows
    assert json.loads(out.read_text()) == rows
    assert (row["nodes"], row["label"], row["cores"]) == (8, "test", os.cpu_count())
    assert row["formed"] and row["false_abort"] is None and row["clients_joined"] == 8
    assert row["join_s"] >= 0 and row["cpu_idle_pct"] >= 0 and row["rss_mb"] > 0
    assert row["sockets_counted"] == 8 and row["bytes_join_per_node"] > 0 and row["bytes_idle_per_node_s"] > 0
    assert row["verdict_told"] == 8 and row["verdict_wrong_cause"] == 0
    assert 0 <= row["verdict_p50_s"] <= row["verdict_p99_s"] <= row["verdict_max_s"]
    assert (row["frozen_named"], row["frozen_kind"]) == (7, "unresponsive")
    assert row["progress"] and row["progress_nodes"] == 8 and row["progress_slowest"] == 7  # the slow one
    assert "| 8 | test | on |" in gang_scale.table(rows)


def test_a_gang_that_does_not_form_is_recorded_and_larger_sizes_skipped(tmp_path, monkeypatch):
    """Within the bound, not a hang: a size whose gang cannot form (here node 0
    is never started) is a row, not an error, and larger sizes are not tried."""
    real_shares = gang_scale.shares
    monkeypatch.setattr(gang_scale, "shares", lambda n, workers: [[x for x in s if x != 0]
                                                                  for s in real_shares(n, workers)])
    out = tmp_path / "gang_scale.json"
    try:
        rows = gang_scale.main(["--nodes", "4,16", "--workers", "1", "--join-bound", "2", "--settle", "0",
                                "--out", str(out)])
    finally:
        gang_scale.kill_all()
    assert not multiprocessing.active_children()
    assert [r["nodes"] for r in rows] == [4, 16]
    assert (rows[0]["formed"], rows[0]["joined_at_end"], rows[0]["false_abort"]) == (False, 3, None)
    assert rows[1]["skipped"] == "4 did not form"
    assert "not formed in 2 s** (3/4 joined)" in gang_scale.table(rows)


def test_pin_puts_the_control_alone_on_the_first_core_and_gives_every_core_back(tmp_path, monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("--pin needs 2 or more cores")
    seen_affinity = []
    original = gang_scale.Pool.__init__

    def recording(self, workers, pin=False):
        original(self, workers, pin)
        seen_affinity.append((sorted(os.sched_getaffinity(0)), [sorted(os.sched_getaffinity(p.pid)) for p in self.procs]))

    monkeypatch.setattr(gang_scale.Pool, "__init__", recording)
    monkeypatch.setattr(gang_scale, "_LIVE", Seen())
    try:
        (row,) = gang_scale.main(["--nodes", "4", "--workers", "1", "--idle", "0.5", "--settle", "0.1",
                                  "--join-bound", "30", "--no-frozen", "--verdict-bound", "10", "--pin",
                                  "--out", str(tmp_path / "rows.json")])
    finally:
        gang_scale.kill_all()
    assert row["pinned"] and row["formed"]
    (control, workers), = seen_affinity
    assert control == cores[:1] and workers == [cores[1:]] * 2
    assert sorted(os.sched_getaffinity(0)) == cores  # given back after the size


def test_pin_on_one_core_is_refused_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(gang_scale, "CORES", [0])
    with pytest.raises(SystemExit):
        gang_scale.parse(["--pin"])
    assert "--pin needs 2 or more cores" in capsys.readouterr().err
