"""Training progress while it runs: a plain script reports its steps, one rank
is three times slower; its node is named in the control's log, the record and
the card. Without progress reports, on GPU nodes, the node whose GPUs idle is
named from nvidia-smi's answer."""

import json
import os
import socket

import pytest

from .helpers import output
from .test_observability import _card_components, _card_creates

pytestmark = pytest.mark.integration


def test_the_slow_node_is_named_in_the_log_the_record_and_the_card(gang):
    gang.env.update({"METAFLOW_TORCHRUN_PROGRESS_SECONDS": "2", "METAFLOW_TORCHRUN_STRAGGLER_RATIO": "1.8",
                     "METAFLOW_TORCHRUN_STRAGGLER_SECONDS": "2"})
    # 16 s: naming takes three progress beats (PROGRESS_SEND) after the first
    # report, which on a loaded CI machine arrives seconds late.
    slow = {"slow-rank": 3, "seconds": 16, "every": 0.1}
    proc = gang.run("--script", "progress_slow.py", "--script-args", json.dumps(slow))
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    host = socket.gethostname()
    named = [line for line in text.splitlines() if "node 1 (" in line and "slower than the median" in line]
    assert len(named) == 1, text[-3000:]  # said once
    assert "ranks 2-3) is" in named[0]
    lines = [line.split("@torchrun: ", 1)[1] for line in text.splitlines() if "@torchrun: progress: step" in line]
    assert lines and all("/160 (" in line and "loss" in line for line in lines), text[-3000:]
    assert any("steps/s, loss" in line and "; slowest: node 1 (%s, ranks 2-3)" % host in line for line in lines)
    assert len(set(lines)) == len(lines)  # a line that says nothing new is not said
    record = gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )
    progress = record["progress"]
    assert [s["node_index"] for s in progress["stragglers"]] == [1]
    straggler = progress["stragglers"][0]
    assert straggler["ranks"] == "2-3" and straggler["ratio"] >= 1.8 and straggler["seconds"] >= 2
    assert progress["total"] == 160 and progress["step"] > 0 and "loss" in progress["metrics"]
    # The card: refreshed while the call ran (Metaflow's runtime render), and the final one.
    assert any("render_runtime" in line for line in _card_creates(gang))
    parts = _card_components(gang)
    text = json.dumps(parts)
    assert "## Progress" in text and "node 1 (%s, ranks 2-3) is" % host in text
    assert "slower than the median" in text and "steps/s per node over time" in text


def test_without_progress_the_node_whose_gpus_idle_is_named_from_nvidia_smi(gang, tmp_path):
    # A stand-in nvidia-smi (no GPU here) that answers as the real one does:
    # node 1's GPU at 20 %, node 0's at 90 %.
    tools = tmp_path / "tools"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text('#!/bin/sh\nif [ "$MF_PARALLEL_NODE_INDEX" = 1 ]; then u=20; else u=90; fi\n'
                   'echo "0, GPU-5e0c2b1a-0000-4000-8000-000000000000, $u"\n')
    smi.chmod(0o755)
    gang.env.update({"METAFLOW_TORCHRUN_STRAGGLER_RATIO": "1.8", "METAFLOW_TORCHRUN_STRAGGLER_SECONDS": "2",
                     "PATH": str(tools) + os.pathsep + gang.env["PATH"]})
    gang.env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = gang.run("--script", "wait.py", "--script-args", json.dumps({"seconds": 12}))
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    named = [line for line in text.splitlines() if "less busy on GPU than the median" in line]
    assert len(named) == 1 and "node 1 (" in named[0], text[-3000:]
    record = gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )
    progress = record["progress"]
    assert progress["signal"].startswith("GPU utilisation") and progress["step"] is None
    assert [(s["node_index"], s["signal"]) for s in progress["stragglers"]] == [(1, progress["signal"])]
