"""Code written for metaflow-torchrun 0.2, and a task without torch, in real flows."""

import os
import socket
import textwrap

import pytest
from our_processes import mentions_torchrun

pytestmark = pytest.mark.integration


def output(proc):
    return proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_0_2_attribute_names_run_with_one_deprecation_line_each(gang):
    port = _free_port()
    proc = gang.run(flow="legacy_flow.py", env={"MFTR_LEGACY": "aliases", "MFTR_PORT": str(port)}, timeout=240)
    text = output(proc)
    assert proc.returncode == 0, text
    assert text.count("master_port= is deprecated") == 1, text
    assert text.count("all_nodes_started_timeout= is deprecated") == 1, text
    # master_port is what it was in 0.2, torchrun's rendezvous port, on every node.
    ports = gang.client("result = Flow('LegacyFlow').latest_run['join'].task['ports'].data")
    assert ports == [port, port]


def test_0_2_list_pairs_run(gang):
    proc = gang.run(flow="legacy_flow.py", env={"MFTR_LEGACY": "pairs"}, timeout=240)
    assert proc.returncode == 0, output(proc)
    assert len(gang.reports("rank-")) == 2


def test_no_torch_is_named_with_the_fix_before_anything_starts(gang, tmp_path):
    # The task's Python cannot import torch: a finder refuses it, as if not installed.
    hide = tmp_path / "hide_torch"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(textwrap.dedent(
        """
        import sys

        class _NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError("No module named 'torch'", name="torch")
                return None

        sys.meta_path.insert(0, _NoTorch())
        """
    ))
    pythonpath = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH")) if p)
    proc = gang.run("--script", "report.py", "--nproc", "1", env={"PYTHONPATH": pythonpath}, timeout=240)
    text = output(proc)
    assert proc.returncode != 0, text
    assert "torch is not installed for" in text, text
    assert 'pip install "torch==2.13.0" numpy' in text, text
    assert not mentions_torchrun(text)  # nothing was launched
    assert "No rank recorded" not in text
