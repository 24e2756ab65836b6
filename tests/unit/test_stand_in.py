"""A stand-in (procs/handoff.py) hands its start to the warm process before it
imports what only a run in its own process needs: four of them a node for every
start of the ranks, each paying its imports in CPU on a shared host.

What it holds is read at the moment it connects to the warm process (Python's
``socket.connect`` audit event), so the check counts modules, not time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ZYGOTE_ENV

PKG = "metaflow_extensions.torchrun.plugins.torchrun"

# Started as torchrun (or the task) starts it: the module as __main__, its modules written as it connects.
AT_CONNECT = r'''
import os, runpy, sys
target, out, module = sys.argv[1], sys.argv[2], sys.argv[3]
def hook(event, args):
    if event == "socket.connect" and args[1] == target:
        names = sorted(sys.modules)
        with open(out, "w") as f:
            f.write("\n".join(names))
        os._exit(0)
sys.addaudithook(hook)
sys.argv = [module] + sys.argv[4:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
'''

# Of the package, a hand-off needs these alone.
HAND_OFF = {PKG, PKG + ".base", PKG + ".base.lazy", PKG + ".host", PKG + ".host.proctree", PKG + ".procs",
            PKG + ".procs.names", PKG + ".procs.zygote_wire", PKG + ".procs.handoff"}
# Of the standard library, none of these: a third of a stand-in's CPU before (typing, dataclasses and
# inspect; logging for an agent).
NEVER = {"typing", "dataclasses", "inspect", "logging", "torch"}


def _at_connect(tmp_path, module, args):
    target, out = str(tmp_path / "warm.sock"), tmp_path / "modules.txt"
    env = dict(os.environ, **{ZYGOTE_ENV: target})
    proc = subprocess.run([sys.executable, "-u", "-c", AT_CONNECT, target, str(out), "%s.procs.%s" % (PKG, module),
                           *args], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and out.exists(), proc.stderr  # it connected to hand off
    return set(out.read_text().split("\n"))


@pytest.mark.parametrize("module, args", [
    ("bootstrap", ["entry.json"]),  # a rank, as torchrun starts it
    ("agent", ["--nnodes", "1", "train.py"]),  # torchrun's agent, as the supervisor starts it
])
def test_a_rank_or_agent_stand_in_holds_only_what_the_hand_off_needs(tmp_path, module, args):
    held = _at_connect(tmp_path, module, args)
    ours = {name for name in held if name.startswith(PKG + ".") or name == PKG}
    assert ours <= HAND_OFF, sorted(ours - HAND_OFF)
    assert not held & NEVER, sorted(held & NEVER)


def test_a_node_zygotes_stand_in_imports_no_typing_or_torch(tmp_path):
    """It needs its own module (its fork guard counts the threads before anything of ours ran),
    and setproctitle, which imports logging."""
    held = _at_connect(tmp_path, "zygote", [str(tmp_path / "own.sock")])
    assert not held & (NEVER - {"logging"}), sorted(held & NEVER)
    assert PKG + ".procs.bootstrap" not in held and PKG + ".procs.agent" not in held
