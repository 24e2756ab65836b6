"""HF's Trainer and Lightning's Trainer report progress under @torchrun with no
change to their scripts (issue 39): a callback the ranks pick up from the
bootstrap's import hook (procs/trainer_hooks.py). Real 2 x 2 runs on CPU, the
smallest models built from code, a dozen steps, nothing downloaded.

What is asserted: every rank's own progress report (what its node reads from
the call's work directory; the scripts copy it out after training, the test's
own check). The bar HF draws with carriage returns reaches the console as
short lines while it is drawn (procs/redraw.py), never as one growing line."""

import json
import math
import os

import pytest

from .helpers import output

pytestmark = pytest.mark.integration

STEPS = 12


def _reports(gang):
    found = {}
    for name in os.listdir(gang.out):
        if name.startswith("rank-") and name.endswith(".progress.json"):
            with open(os.path.join(gang.out, name)) as f:
                found[int(name[len("rank-"):-len(".progress.json")])] = json.load(f)
    return found


def _check_reports(gang):
    reports = _reports(gang)
    assert sorted(reports) == [0, 1, 2, 3], reports
    for one in reports.values():
        assert one["step"] == STEPS and one["total"] == STEPS, one
        loss, lr = one["metrics"].get("loss"), one["metrics"].get("learning_rate")
        assert loss is not None and math.isfinite(loss) and loss > 0, one
        assert lr is not None and lr >= 0, one


def test_an_hf_trainer_reports_step_total_loss_and_learning_rate(gang):
    proc = gang.run("--script", "hf_trainer.py", timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    _check_reports(gang)
    # HF's tqdm bar (rank 0 draws it): its states as lines of their own, the last one whole.
    bar = [line for line in text.splitlines() if "[rank0]:" in line and "it/s]" in line]
    assert bar and any("%d/%d [" % (STEPS, STEPS) in line for line in bar), text[-3000:]
    assert max(len(line) for line in bar) < 300, max(bar, key=len)


def test_a_lightning_trainer_reports_step_total_loss_and_learning_rate(gang):
    proc = gang.run("--script", "lightning_trainer.py", timeout=400)
    assert proc.returncode == 0, output(proc)[-3000:]
    _check_reports(gang)
