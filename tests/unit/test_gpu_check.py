"""benchmarks/gpu.py (make gpu-check) where there is no GPU: it parses its
arguments and refuses in one line, naming what it needs, before any flow runs."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU = os.path.join(REPO, "benchmarks", "gpu.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, GPU, *args], capture_output=True, text=True, timeout=180, cwd=REPO)


def test_without_a_gpu_it_refuses_cleanly_naming_what_it_needs(tmp_path):
    out = tmp_path / "results"
    proc = _run("--skip-timings", "--out", str(out), "--python", sys.executable)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "the GPU check needs at least one CUDA device; %s (torch %s) sees none" % (
        sys.executable, __import__("torch").__version__)
    assert proc.stdout == "" and not out.exists()  # nothing ran, nothing written


def test_an_interpreter_without_torch_or_metaflow_is_named(tmp_path):
    proc = _run("--skip-timings", "--python", "/nonexistent/python3")
    assert proc.returncode == 2 and proc.stderr.startswith("/nonexistent/python3 could not be run: ")
    assert "Traceback" not in proc.stderr


def test_its_arguments_parse_and_bad_ones_are_refused_by_name():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(os.path.join(REPO, "benchmarks"))
    args = gpu.parse_args(["--pairs", "2", "--python", "/a/python", "--python", "/b/python"])
    assert (args.pairs, args.python, args.skip_timings) == (2, ["/a/python", "/b/python"], False)
    assert gpu._at_least("2.15.0+cu132", (2, 15)) and not gpu._at_least("2.14.1", (2, 15))
    proc = _run("--pairs", "0")
    assert proc.returncode == 2 and "--pairs must be at least 1" in proc.stderr
