"""procs/rank_progress.py: a rank's progress reports, as a real rank process makes
them (through the public short path) and as its node reads them back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from metaflow_extensions.torchrun.plugins.torchrun.procs import names, rank_progress
from metaflow_extensions.torchrun.plugins.torchrun.procs.rank_progress import ProgressReport, read_progress


def _rank(tmp_path, body: str, rank: str = "3", work_dir: bool = True, wait: bool = True, **more: str):
    env = {k: v for k, v in os.environ.items() if k not in (names.WORK_DIR_ENV, names.RESTART_COUNT_ENV)}
    env.update(more, RANK=rank)
    if work_dir:
        env[names.WORK_DIR_ENV] = str(tmp_path)
    script = "from metaflow_extensions.torchrun.progress import report\n" + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out, err


def test_the_last_report_is_in_the_file_when_the_rank_exits(tmp_path):
    _rank(tmp_path, """
        for step in range(20000):
            report(step, total=20000, loss=1.0 / (step + 1), lr=3e-4)
    """)
    data = json.loads((tmp_path / "rank-3.progress.json").read_text())
    assert data["step"] == 19999 and data["total"] == 20000 and data["rank"] == 3
    assert data["metrics"] == {"loss": 1.0 / 20000, "lr": 3e-4}
    assert oct(os.stat(tmp_path / "rank-3.progress.json").st_mode & 0o777) == "0o600"
    assert read_progress(str(tmp_path))[3].step == 19999
    assert sorted(os.listdir(tmp_path)) == ["rank-3.progress.json"]


def test_a_report_says_which_start_of_the_ranks_it_belongs_to(tmp_path):
    """A restart's ranks (torchelastic's count, which the bootstrap sets from the gang's restart) are told
    from the replaced ranks, whose files stay in the work directory until the new ranks' replace them."""
    _rank(tmp_path, "report(7)\n", TORCHELASTIC_RESTART_COUNT="2")
    data = json.loads((tmp_path / "rank-3.progress.json").read_text())
    assert data["start"] == 2 and read_progress(str(tmp_path))[3].start == 2
    _rank(tmp_path, "report(8)\n")  # the first start: no count, and nothing more on the file
    assert "start" not in json.loads((tmp_path / "rank-3.progress.json").read_text())
    assert read_progress(str(tmp_path))[3].start == 0
    for bad in (-1, "2", 2.5, True, None):
        assert ProgressReport.from_file({"rank": 1, "step": 2, "time": 1.0, "start": bad}).start == 0


def test_at_most_one_write_a_second_while_it_reports_every_step(tmp_path):
    proc = _rank(tmp_path, """
        import time
        end = time.time() + 3.0
        step = 0
        while time.time() < end:
            report(step)
            step += 1
    """, wait=False)
    path = tmp_path / "rank-3.progress.json"
    seen = set()
    try:
        while proc.poll() is None:
            try:
                seen.add(os.stat(path).st_ino)  # each write replaces the file
            except FileNotFoundError:
                pass
            time.sleep(0.02)
    finally:
        proc.communicate(timeout=30)
    assert 1 <= len(seen) <= 5  # 3 s: at most 3 timed writes and the last, never one per step


def test_outside_torchrun_a_report_goes_nowhere(tmp_path):
    out, _ = _rank(tmp_path, """
        import threading
        report(1, loss=0.5)
        print(threading.active_count())
    """, work_dir=False)
    assert out.strip() == "1" and os.listdir(tmp_path) == []


def test_a_step_that_is_not_a_whole_number_is_said_once_and_not_written(tmp_path):
    _, err = _rank(tmp_path, """
        import time
        report("ten")
        time.sleep(1.3)
        report(-1)
    """)
    assert err.count("progress.report(step='ten') ignored") == 1 and "step=-1" not in err
    assert os.listdir(tmp_path) == []


def test_a_forked_child_does_not_write_its_parents_file(tmp_path):
    _rank(tmp_path, """
        import os
        report(5)
        pid = os.fork()
        if pid == 0:
            report(999)
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    assert read_progress(str(tmp_path))[3].step == 5


def test_metrics_are_bounded_and_finite():
    given = {"m%d" % i: float(i) for i in range(12)}
    given.update({"nan": float("nan"), "x" * 41: 1.0, "flag": True, "text": "1.5"})
    kept = rank_progress.clean_metrics({"inf": float("inf"), "a": "no", **given})
    assert list(kept) == ["m%d" % i for i in range(8)]
    assert rank_progress.clean_metrics([1, 2]) == {}


def test_a_hostile_file_reads_as_no_report(tmp_path):
    good = {"rank": 2, "step": 7, "total": 10, "metrics": {"loss": 0.5}, "time": 1.5}
    assert ProgressReport.from_file(good) == ProgressReport(2, 7, 10, {"loss": 0.5}, 1.5)
    for bad in ({**good, "step": -1}, {**good, "step": True}, {**good, "step": 1.5}, {**good, "rank": "2"},
                {**good, "time": float("nan")}, {**good, "step": 2**60}, [good], None):
        assert ProgressReport.from_file(bad) is None
    assert ProgressReport.from_file({**good, "total": "ten"}).total is None
    assert ProgressReport.from_file({**good, "total": 0}).total is None
    (tmp_path / "rank-2.progress.json").write_text(json.dumps(good))
    (tmp_path / "rank-5.progress.json").write_text(json.dumps(good))  # says rank 2: not rank 5's
    (tmp_path / "rank-6.progress.json").write_text("{half")
    os.symlink(tmp_path / "rank-2.progress.json", tmp_path / "rank-7.progress.json")
    assert list(read_progress(str(tmp_path))) == [2]
    assert read_progress(str(tmp_path / "gone")) == {}
