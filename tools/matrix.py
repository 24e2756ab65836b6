#!/usr/bin/env python3
"""Version matrix: one fresh virtualenv per cell, the built wheel installed into it,
then the unit tests, examples/hello, examples/function, a hang whose culprit is
named and an in-step restart run in it.

    make matrix                                # every cell, venvs under /tmp/matrix
    python3 tools/matrix.py --only py3.12      # cells whose name contains "py3.12"
    python3 tools/matrix.py --dir DIR --list

Standard library only: run it with any Python 3. Venvs are kept between runs (the
wheel is reinstalled every time); delete DIR to start from nothing. Results go to
DIR/results.json and DIR/results.md (a table for the README).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_PINS = ["pytest==9.2.0", "pytest-timeout==2.4.0", "numpy==2.3.5", "hypothesis==6.170.15", "jsonschema==4.26.0"]
# What the unit tests read beside tests/ (tools/, benchmarks' harness, the docs):
# never the package's source, which would sit on sys.path beside the wheel.
TEST_TREES = ("tests", "tools", "benchmarks", "docs")
# Unit tests of the repository itself (its docs, packaging, the docs
# site's own venv) or of packages only the dev venv has (transformers,
# metaflow-checkpoint): the same whatever the versions, run by `make test`, left
# out of a cell.
REPO_TESTS = ("test_docs.py", "test_docs_render.py", "test_docs_snippets.py",
              "test_install_recipe.py", "test_packaging.py", "test_trainer_hooks.py")
NO_TORCH_MESSAGE = 'pip install "torch=='  # launch/torch_checks.TORCH_INSTALL_HINT


@dataclass(frozen=True)
class Cell:
    python: str
    metaflow: str
    torch: Optional[str]  # None: no torch (the flows must fail with the install hint)
    # pip's configuration left out for this cell's install only: a machine may
    # cap torch in a site-wide pip.conf (this one: torch<=2.14.1 in /etc/xdg/pip).
    uncapped: bool = False

    @property
    def name(self) -> str:
        return "py%s-mf%s-%s" % (
            self.python,
            self.metaflow,
            "torch%s" % self.torch if self.torch else "notorch",
        )


# The oldest metaflow claimed, one in the middle (the last before Metaflow's
# `inserted_by`), the newest; every Python claimed; torch as pinned in
# requirements-dev.txt; and one cell without torch.
CELLS = [
    Cell("3.11", "2.12.0", "2.13.0"),
    Cell("3.11", "2.15.21", "2.13.0"),
    Cell("3.11", "2.19.39", "2.13.0"),
    Cell("3.12", "2.19.39", "2.13.0"),
    Cell("3.13", "2.19.39", "2.13.0"),
    Cell("3.11", "2.19.39", None),
    # The newest releases: 2.14.1 (reconfigure, DistNetworkError on a port in use)
    # and 2.15.0 (nccl2 the default NCCL, the Flight Recorder per backend), both
    # PyPI's CUDA builds, run on CPU.
    Cell("3.11", "2.19.39", "2.14.1"),
    Cell("3.11", "2.19.39", "2.15.0", uncapped=True),
]

# Beyond the unit tests and the examples, each cell with torch runs these real
# flows: a hang whose culprit is named (gloo's Flight Recorder, then the stacks)
# and an in-step restart.
FLOW_TESTS = {
    "hang_culprit": "tests/integration/test_stops.py::test_hang_timeout_names_the_rank_that_skipped_a_collective",
    "restart": "tests/integration/test_restarts.py::test_a_rank_killed_twice_restarts_twice_in_the_same_tasks_and_resumes",
}


def find_python(version: str) -> Optional[str]:
    """``python3.X`` on PATH, else a pyenv install of it."""
    env_override = os.environ.get("MATRIX_PYTHON_%s" % version.replace(".", "_"))
    if env_override:
        return env_override
    candidates = [shutil.which("python%s" % version)]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version)))
    for path in candidates:
        if not path:
            continue
        try:
            out = subprocess.run(
                [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return path
    return None


def sh(cmd: List[str], log, cwd: str = REPO, env: Optional[Dict[str, str]] = None, timeout: float = 1800) -> int:
    log.write("\n$ %s\n" % " ".join(cmd))
    log.flush()
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        log.write("\n[matrix] timed out after %d s\n" % timeout)
        return 124


def build_wheel(out_dir: str, log) -> str:
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    code = sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out_dir, REPO], log)
    wheels = glob.glob(os.path.join(out_dir, "*.whl"))
    if code != 0 or len(wheels) != 1:
        raise SystemExit("could not build the wheel (see %s)" % log.name)
    return wheels[0]


def run_cell(cell: Cell, root: str, wheel: str, install_only: bool = False) -> Dict[str, object]:
    venv = os.path.join(root, cell.name)
    result: Dict[str, object] = {"cell": cell.name, "python": cell.python, "metaflow": cell.metaflow, "torch": cell.torch or "none"}
    os.makedirs(venv, exist_ok=True)
    log_path = os.path.join(root, cell.name + ".log")
    with open(log_path, "w") as log:
        result["log"] = log_path
        python = find_python(cell.python)
        if python is None:
            result["result"] = "skipped: no Python %s on this machine" % cell.python
            return result
        bin_dir = os.path.join(venv, "bin")
        pip_env = dict(os.environ, PIP_CONFIG_FILE=os.devnull) if cell.uncapped else None
        marker = os.path.join(venv, ".matrix-installed")
        wanted = json.dumps([cell.python, cell.metaflow, cell.torch, TEST_PINS])
        started = time.time()
        if not (os.path.exists(marker) and open(marker).read() == wanted):
            shutil.rmtree(venv, ignore_errors=True)
            if sh([python, "-m", "venv", venv], log) != 0:
                result["result"] = "fail: venv"
                return result
            pip = [os.path.join(bin_dir, "python"), "-m", "pip", "install", "--quiet"]
            reqs = ["metaflow==%s" % cell.metaflow] + TEST_PINS
            if cell.torch:
                reqs.append("torch==%s" % cell.torch)
            if sh(pip + ["pip>=23.1"], log) != 0 or sh(pip + reqs, log, env=pip_env) != 0:
                result["result"] = "fail: install"
                return result
            with open(marker, "w") as f:
                f.write(wanted)
        py = os.path.join(bin_dir, "python")
        if sh([py, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel], log) != 0 \
                or sh([py, "-m", "pip", "install", "--quiet", wheel], log, env=pip_env) != 0:  # its own dependencies
            result["result"] = "fail: wheel install"
            return result
        result["install_s"] = round(time.time() - started, 1)
        versions = subprocess.run(
            [py, "-c", "import platform, metaflow; v = [platform.python_version(), metaflow.__version__]\n"
             "try:\n import torch; v.append(torch.__version__)\nexcept ImportError:\n v.append('none')\nprint(' '.join(v))"],
            capture_output=True, text=True, cwd=root,
        ).stdout.split()
        result["versions"] = versions
        if install_only:
            result["result"] = "installed"
            return result
        env = dict(os.environ)
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        env.setdefault("METAFLOW_USER", "matrix")
        env["METAFLOW_DATASTORE_SYSROOT_LOCAL"] = os.path.join(venv, "mfroot")
        env.pop("PYTHONPATH", None)
        steps: Dict[str, str] = {}
        # The tests run from a copy outside the repository (some start Python from
        # their tree's root) and through the `pytest` script, not `python -m pytest`:
        # either way the source tree would sit on sys.path beside the wheel.
        t0 = time.time()
        work = os.path.join(venv, "work")
        shutil.rmtree(work, ignore_errors=True)
        for tree in TEST_TREES:
            shutil.copytree(os.path.join(REPO, tree), os.path.join(work, tree),
                            ignore=shutil.ignore_patterns("__pycache__", "results"))
        for name in ("pytest.ini", "mkdocs.yml", "README.md"):
            shutil.copy(os.path.join(REPO, name), work)
        extra = os.environ.get("MATRIX_PYTEST_ARGS", "").split()
        ignored = ["--ignore=tests/unit/" + name for name in REPO_TESTS]
        code = sh([os.path.join(bin_dir, "pytest"), "tests/unit", "-q", "-p", "no:cacheprovider", *ignored, *extra],
                  log, cwd=work, env=env)
        steps["unit"] = "pass" if code == 0 else "fail (%d)" % code
        if cell.torch:
            for step, test in FLOW_TESTS.items():
                code = sh([os.path.join(bin_dir, "pytest"), test, "-q", "-p", "no:cacheprovider"],
                          log, cwd=work, env=env, timeout=900)
                steps[step] = "pass" if code == 0 else "fail (%d)" % code
        for example in ("hello", "function"):
            mark = log.tell()
            code = sh([py, "flow.py", "run"], log, cwd=os.path.join(REPO, "examples", example), env=env, timeout=600)
            if cell.torch:
                steps[example] = "pass" if code == 0 else "fail (%d)" % code
            else:
                log.flush()
                with open(log_path) as f:
                    f.seek(mark)
                    said = NO_TORCH_MESSAGE in f.read()
                steps[example] = "fails as expected, naming the fix" if code != 0 and said else "fail (%d, no install hint)" % code
        result["steps"] = steps
        result["tests_s"] = round(time.time() - t0, 1)
        ok = all(v == "pass" or v.startswith("fails as expected") for v in steps.values())
        result["result"] = "pass" if ok else "fail"
        return result


def markdown(results: List[Dict[str, object]], date: str) -> str:
    lines = [
        "Measured %s on this project's 2-core machine (`make matrix`):" % date,
        "",
        "| python | metaflow | torch | unit tests | examples/hello | examples/function | hang, culprit | in-step restart"
        " | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        steps = r.get("steps") or {}
        versions = r.get("versions") or [r["python"], r["metaflow"], r["torch"]]
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                versions[0] if versions else r["python"],
                r["metaflow"],
                versions[2] if len(versions) > 2 else r["torch"],
                steps.get("unit", "-"),
                steps.get("hello", "-"),
                steps.get("function", "-"),
                steps.get("hang_culprit", "-"),
                steps.get("restart", "-"),
                r["result"],
            )
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.environ.get("MATRIX_DIR", "/tmp/matrix"))
    parser.add_argument("--only", action="append", default=[], help="run cells whose name contains this (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument("--install-only", action="store_true", help="build the venvs, run nothing")
    args = parser.parse_args()
    cells = [c for c in CELLS if not args.only or any(o in c.name for o in args.only)]
    if args.list:
        print("\n".join(c.name for c in cells))
        return 0
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "build.log"), "w") as log:
        wheel = build_wheel(os.path.join(args.dir, "dist"), log)
    results = []
    for cell in cells:
        print("[matrix] %s ..." % cell.name, flush=True)
        r = run_cell(cell, args.dir, wheel, args.install_only)
        print("[matrix] %s: %s %s" % (cell.name, r["result"], r.get("steps", "")), flush=True)
        results.append(r)
    date = datetime.date.today().isoformat()
    with open(os.path.join(args.dir, "results.json"), "w") as f:
        json.dump({"date": date, "wheel": os.path.basename(wheel), "cells": results}, f, indent=2)
    table = markdown(results, date)
    with open(os.path.join(args.dir, "results.md"), "w") as f:
        f.write(table)
    print(table)
    return 0 if all(r["result"] == "pass" or str(r["result"]).startswith("skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
