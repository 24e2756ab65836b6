"""HF's Trainer and Lightning's Trainer report progress under @torchrun with no
change to their scripts (issue 39): a callback the ranks pick up from the
bootstrap's import hook (procs/trainer_hooks.py). Real 2 x 1 runs on CPU, the
smallest models built from code, a dozen steps, nothing downloaded.

What is asserted is what a user sees: the control's progress line and the
result record's progress (step, total, loss, learning rate). The bar HF draws
with carriage returns reaches the console as short lines while it is drawn
(procs/redraw.py), never as one growing line."""

import math
import re

import pytest

from .helpers import output

pytestmark = pytest.mark.integration

STEPS = 12


def _check_progress(gang, text):
    lines = [line for line in text.splitlines() if "@torchrun: progress: step" in line]
    assert lines and all("/%d (" % STEPS in line and "loss" in line for line in lines), text[-3000:]
    record = gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )
    progress = record["progress"]
    assert progress["step"] == STEPS and progress["total"] == STEPS, progress
    loss, lr = progress["metrics"].get("loss"), progress["metrics"].get("learning_rate")
    assert loss is not None and math.isfinite(loss) and loss > 0, progress
    assert lr is not None and lr >= 0, progress


def test_an_hf_trainer_reports_step_total_loss_and_learning_rate(gang):
    gang.env["METAFLOW_TORCHRUN_PROGRESS_SECONDS"] = "1"
    proc = gang.run("--script", "hf_trainer.py", "--nproc", "1", timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    _check_progress(gang, text)
    # HF's tqdm bar (rank 0 draws it): its states as lines of their own, the last one whole.
    # Its rate reads "1.2it/s]", or "1.01s/it]" when a step takes over a second (under load).
    bar = [line for line in text.splitlines() if "[rank0]:" in line and re.search(r"(it/s|s/it)\]", line)]
    assert bar and any("%d/%d [" % (STEPS, STEPS) in line for line in bar), text[-3000:]
    assert max(len(line) for line in bar) < 300, max(bar, key=len)


def test_a_lightning_trainer_reports_step_total_loss_and_learning_rate(gang):
    gang.env["METAFLOW_TORCHRUN_PROGRESS_SECONDS"] = "1"
    proc = gang.run("--script", "lightning_trainer.py", "--nproc", "1", timeout=400)
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    _check_progress(gang, text)
