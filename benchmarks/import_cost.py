"""What the extension adds to ``import metaflow``, and what a rank's start imports of ours.

``import metaflow`` is timed in fresh processes of this venv's Python, with the extension installed
and without it: the same venv's site-packages, linked entry by entry into a scratch venv
(build/import_cost/), all but this package's editable install and its metadata, as
``pip uninstall metaflow-torchrun`` would leave it. Runs are interleaved (with, without, with, ...),
after one of each to compile the bytecode; the figures are medians. A rank's start is timed the same
way against ``python -c pass``: its stand-in (the modules loaded before it hands off to the warm
process) and a fresh rank (``procs/bootstrap.py`` with no warm process, before the user's script).

    .venv/bin/python benchmarks/import_cost.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from typing import Dict, List, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "metaflow_extensions.torchrun.plugins.torchrun"
SCRATCH = os.path.join(REPO, "build", "import_cost", "without")
OURS = ("__editable__.metaflow_torchrun", "metaflow_torchrun-", "__editable___metaflow_torchrun")
# What a process loaded, said on stdout: checked once per setup, never in a timed run.
LOADED = ("import json, sys; import metaflow; print(json.dumps({'ours': sorted(m for m in sys.modules if "
          "m.startswith('metaflow_extensions.torchrun')), 'torch': 'torch' in sys.modules, "
          "'exported': hasattr(metaflow, 'TorchrunResult')}))")


def scratch_venv() -> str:
    """A venv whose site-packages is this one's without the extension; its python."""
    python = os.path.join(SCRATCH, "bin", "python")
    if not os.path.exists(python):
        shutil.rmtree(SCRATCH, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", SCRATCH], check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    for name in os.listdir(ours):
        link = os.path.join(site, name)
        if not name.startswith(OURS) and not os.path.lexists(link):
            os.symlink(os.path.join(ours, name), link)
    return python


def clean_env() -> Dict[str, str]:
    """Nothing that would find the extension some other way, or hide it."""
    drop = ("PYTHONPATH", "METAFLOW_EXTENSIONS_SEARCH_DIRS", "METAFLOW_DEBUG_EXT", "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def timed(argv: Sequence[str], env: Dict[str, str]) -> Tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process: on a busy machine the CPU is the steadier."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, cwd="/", check=True, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def paired(a: Sequence[str], b: Sequence[str], runs: int, env: Dict[str, str]) -> Dict[str, float]:
    """Medians in ms of ``a``, ``b`` and of ``a - b`` pair by pair (wall, and CPU as ``cpu_*``),
    after one untimed run of each."""
    timed(a, env), timed(b, env)
    times: Dict[str, List[float]] = {k: [] for k in ("a", "b", "diff", "cpu_a", "cpu_b", "cpu_diff")}
    for _ in range(runs):
        (wa, ca), (wb, cb) = timed(a, env), timed(b, env)
        for key, value in (("a", wa), ("b", wb), ("diff", wa - wb), ("cpu_a", ca), ("cpu_b", cb), ("cpu_diff", ca - cb)):
            times[key].append(value)
    return {k: round(statistics.median(v) * 1000, 1) for k, v in times.items()}


def said(cost: Dict[str, float], a: str, b: str) -> str:
    return ("wall %.1f %s, %.1f %s: +%.1f; CPU %.1f, %.1f: +%.1f (ms, medians; the + of pairs)"
            % (cost["a"], a, cost["b"], b, cost["diff"], cost["cpu_a"], cost["cpu_b"], cost["cpu_diff"]))


def loaded(python: str, env: Dict[str, str]) -> dict:
    out = subprocess.run([python, "-c", LOADED], env=env, cwd="/", check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours_imported(code: str, env: Dict[str, str]) -> List[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         env=env, cwd="/", check=True, capture_output=True, text=True)
    return out.stdout.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    env = clean_env()
    without = scratch_venv()
    with_ext, without_ext = loaded(sys.executable, env), loaded(without, env)
    assert with_ext["exported"] and not without_ext["exported"] and not without_ext["ours"], (with_ext, without_ext)
    mf = paired([sys.executable, "-c", "import metaflow"], [without, "-c", "import metaflow"], args.runs, env)
    print("import metaflow, %d runs each: %s" % (args.runs, said(mf, "with the extension", "without")))
    print("  of ours: %d modules; torch imported: %s" % (len(with_ext["ours"]), with_ext["torch"]))
    bare = [sys.executable, "-c", "pass"]
    for label, code in (("a rank's stand-in (handoff)", "import %s.procs.handoff" % PKG),
                        ("a fresh rank (bootstrap)", "import %s.procs.bootstrap" % PKG)):
        cost = paired([sys.executable, "-c", code], bare, args.runs, env)
        modules = ours_imported(code, env)
        ours = [m for m in modules if m.startswith("metaflow_extensions")]
        heavy = [m for m in ("typing", "dataclasses", "inspect", "logging", "metaflow", "torch") if m in modules]
        print("%s: %s" % (label, said(cost, "", "for `python -c pass`")))
        print("  %d modules of ours; loads %s" % (len(ours), ", ".join(heavy) or "none of typing, dataclasses, "
                                                  "inspect, logging, metaflow, torch"))
    print("load average: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
