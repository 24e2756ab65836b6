"""What the extension adds to ``import metaflow``, and what a rank's start imports of ours.

``import metaflow`` is timed in fresh processes of this venv's Python, with the extension installed
and without it: the same venv's site-packages, linked entry by entry into a scratch venv
(build/import_cost/), all but this package's editable install and its metadata, as
``pip uninstall metaflow-torchrun`` would leave it. Commands run in rounds (without, with, ...),
after one untimed round to compile the bytecode; the figures are medians, each ``+`` the median of
the differences within a round. CPU (user + system) is the steadier on a busy machine. A rank's
start is timed the same way against ``python -c pass``: its stand-in (the modules loaded before it
hands off to the warm process) and a fresh rank (``procs/bootstrap.py`` with no warm process,
before the user's script). ``--before REV``: the same figures, in the same run, for the package as it was at commit REV (its
``metaflow_extensions/`` exported beside, installed as the editable install is). ``--instructions``:
also the instructions each ``import metaflow`` executes, counted by valgrind (callgrind), which no
other load on the machine changes. ``--floor``: the same figures for what Metaflow costs per extension,
whatever it holds: this package's metadata with one ``mfextinit`` that declares nothing ("empty"), and
that with as many empty files as this tree has (Metaflow walks an extension's every file).

    .venv/bin/python benchmarks/import_cost.py [--runs 20] [--before REV] [--instructions] [--floor]
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
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = "metaflow_extensions.torchrun.plugins.torchrun"
SCRATCH = os.path.join(REPO, "build", "import_cost", "without")
OURS = ("__editable__.metaflow_torchrun", "metaflow_torchrun-", "__editable___metaflow_torchrun")
# What a process loaded, said on stdout: checked once per setup, never in a timed run.
LOADED = ("import json, sys; import metaflow; print(json.dumps({'ours': sorted(m for m in sys.modules if "
          "m.startswith('metaflow_extensions.torchrun')), 'torch': 'torch' in sys.modules, "
          "'exported': hasattr(metaflow, 'TorchrunResult')}))")


def scratch_venv(where: str = SCRATCH, package: Optional[str] = None) -> str:
    """A venv whose site-packages is this one's without the extension (with ``package``'s tree
    installed as the editable install is, if given); its python."""
    python = os.path.join(where, "bin", "python")
    if not os.path.exists(python):
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    for name in os.listdir(ours):
        link = os.path.join(site, name)
        if (package or not name.startswith(OURS)) and not name.startswith("__editable__") \
                and not os.path.lexists(link):
            os.symlink(os.path.join(ours, name), link)
    for name in os.listdir(ours) if package else ():
        if name.startswith("__editable__.metaflow_torchrun"):  # its name as the metadata's RECORD gives it
            with open(os.path.join(site, name), "w") as f:
                f.write(package + "\n")
    return python


def export(rev: str) -> str:
    """``metaflow_extensions/`` as it was at commit ``rev``, under build/import_cost/; its folder."""
    tree = os.path.join(REPO, "build", "import_cost", "tree-" + rev)
    if not os.path.isdir(tree):
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", REPO, "archive", rev, "metaflow_extensions"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def floor_tree(files: bool) -> str:
    """An extension that declares nothing, under build/import_cost/ (with ``files``: an empty file for each
    of this tree's files, in its folders); its folder."""
    tree = os.path.join(REPO, "build", "import_cost", "floor-files" if files else "floor")
    shutil.rmtree(tree, ignore_errors=True)
    listed = subprocess.run(["git", "-C", REPO, "ls-files", "metaflow_extensions"], check=True, capture_output=True,
                            text=True).stdout.split() if files else []
    init = os.path.join("metaflow_extensions", "torchrun", "plugins", "mfextinit_torchrun.py")
    for path in set(listed) | {init}:
        os.makedirs(os.path.dirname(os.path.join(tree, path)), exist_ok=True)
        with open(os.path.join(tree, path), "w") as f:
            f.write("STEP_DECORATORS_DESC = []\n" if path == init else "")
    return tree


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


def interleaved(commands: Dict[str, Sequence[str]], base: str, runs: int,
                env: Dict[str, str]) -> Dict[str, Dict[str, float]]:
    """Each command run in turn, ``runs`` rounds, after one untimed round; per command the medians
    in ms of its wall and CPU time, and of its difference from ``base``'s in the same round."""
    for argv in commands.values():
        timed(argv, env)
    times: Dict[str, Dict[str, List[float]]] = {k: {"wall": [], "cpu": [], "wall+": [], "cpu+": []} for k in commands}
    for _ in range(runs):
        round_ = {k: timed(argv, env) for k, argv in commands.items()}
        for k, (w, c) in round_.items():
            for key, value in (("wall", w), ("cpu", c), ("wall+", w - round_[base][0]), ("cpu+", c - round_[base][1])):
                times[k][key].append(value)
    return {k: {key: round(statistics.median(v) * 1000, 1) for key, v in t.items()} for k, t in times.items()}


def said(cost: Dict[str, float]) -> str:
    return "+%.1f ms CPU, +%.1f ms wall (%.1f and %.1f in all)" % (cost["cpu+"], cost["wall+"], cost["cpu"], cost["wall"])


def loaded(python: str, env: Dict[str, str]) -> dict:
    out = subprocess.run([python, "-c", LOADED], env=env, cwd="/", check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours_imported(python: str, code: str, env: Dict[str, str]) -> List[str]:
    out = subprocess.run([python, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         env=env, cwd="/", check=True, capture_output=True, text=True)
    return out.stdout.split()


def instructions(python: str, env: Dict[str, str]) -> int:
    """What one ``import metaflow`` executes, in instructions (the hash seed fixed)."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c",
                          "import metaflow"], env=dict(env, PYTHONHASHSEED="0"), cwd="/", check=True,
                         capture_output=True, text=True).stderr
    return int(out.split("Collected :")[1].split()[0])


def modules(python: str, code: str, env: Dict[str, str]) -> str:
    loaded = ours_imported(python, code, env)
    heavy = [m for m in ("typing", "dataclasses", "inspect", "logging", "metaflow", "torch") if m in loaded]
    return "%d modules of ours; loads %s" % (len([m for m in loaded if m.startswith("metaflow_extensions")]),
                                             ", ".join(heavy) or "none of %s" % ", ".join(NEVER))


NEVER = ("typing", "dataclasses", "inspect", "logging", "metaflow", "torch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--before", help="a commit: its package measured too, in the same rounds")
    parser.add_argument("--instructions", action="store_true", help="count them with valgrind too")
    parser.add_argument("--floor", action="store_true", help="an extension that declares nothing, measured too")
    args = parser.parse_args()
    env = clean_env()
    pythons = {"this tree": sys.executable}
    if args.before:
        tree = export(args.before)
        pythons[args.before] = scratch_venv(os.path.join(REPO, "build", "import_cost", "venv-" + args.before), tree)
    floors = {}
    for label, files in (("empty", False), ("empty+files", True)) if args.floor else ():
        where = os.path.join(REPO, "build", "import_cost", "venv-" + label.replace("+", "-"))
        floors[label] = scratch_venv(where, floor_tree(files))
    without = scratch_venv()
    assert not loaded(without, env)["ours"]
    for label, python in pythons.items():
        seen = loaded(python, env)
        assert seen["exported"] and not seen["torch"], seen
    measured = dict(pythons, **floors)
    mf = interleaved(dict({"without": [without, "-c", "import metaflow"]},
                          **{k: [p, "-c", "import metaflow"] for k, p in measured.items()}), "without", args.runs, env)
    print("`import metaflow`, medians of %d rounds, over the same venv without the extension:" % args.runs)
    for label, python in measured.items():
        print("  %-11s %s; %s" % (label, said(mf[label]), modules(python, "import metaflow", env)))
    if args.instructions:
        bare = instructions(without, env)
        for label, python in measured.items():
            count = instructions(python, env)
            print("  %-11s +%.1f M instructions over %.1f M without (+%.1f %%)"
                  % (label, (count - bare) / 1e6, bare / 1e6, 100.0 * (count - bare) / bare))
    for what, module in (("a rank's stand-in, to its hand-off", "handoff"),
                         ("a fresh rank, before the user's script", "bootstrap")):
        code = "import %s.procs.%s" % (PKG, module)
        cost = interleaved(dict({"pass": [sys.executable, "-c", "pass"]},
                                **{k: [p, "-c", code] for k, p in pythons.items()}), "pass", args.runs, env)
        print("%s (procs/%s.py), over `python -c pass`:" % (what, module))
        for label, python in pythons.items():
            print("  %-10s %s; %s" % (label, said(cost[label]), modules(python, code, env)))
    print("load average: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
