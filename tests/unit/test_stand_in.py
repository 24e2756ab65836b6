"""A stand-in (procs/handoff.py) hands its start to the warm process before it
imports what only a run in its own process needs: four of them a node for every
start of the ranks, each paying its imports in CPU on a shared host.

What it holds is read at the moment it connects to the warm process (Python's
``socket.connect`` audit event), so the check counts modules, not time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ZYGOTE_ENV
from metaflow_extensions.torchrun.plugins.torchrun.procs.zygote_wire import recv_request, reply

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
HAND_OFF = {PKG, PKG + ".base", PKG + ".base.timeouts", PKG + ".host", PKG + ".host.proctree",
            PKG + ".host.unix_socket", PKG + ".procs",
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


WARMED = r'''
import sys
from metaflow_extensions.torchrun.plugins.torchrun.procs import zygote
before = {m for m in sys.modules if m.startswith(sys.argv[1])}
zygote.warm(".")
print(" ".join(sorted({m for m in sys.modules if m.startswith(sys.argv[1])} - before)))
'''


def test_the_warm_process_imports_what_its_children_run_before_it_forks_them(tmp_path):
    """Each forked agent and rank would import them itself (a torch of nothing here: the
    warm process's own import is not what is checked)."""
    fake = tmp_path / "torch"
    (fake / "distributed").mkdir(parents=True)
    for init in (fake / "__init__.py", fake / "distributed" / "__init__.py", fake / "distributed" / "run.py"):
        init.write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", WARMED, PKG + ".procs."], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    imported = set(proc.stdout.split())
    assert {PKG + ".procs.bootstrap", PKG + ".procs.agent", PKG + ".procs.relay"} <= imported, sorted(imported)


# Its first try finds no socket (said in a file); its second waits until the test has bound one.
SECOND_TRY = r"""
import os, runpy, sys, time
target, said, bound = sys.argv[1], sys.argv[2], sys.argv[3]
tries = []
def hook(event, args):
    if event == "socket.connect" and args[1] == target:
        tries.append(1)
        if len(tries) == 1:
            open(said, "w").close()
        else:
            while not os.path.exists(bound):
                time.sleep(0.01)
sys.addaudithook(hook)
sys.argv = sys.argv[4:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def test_a_stand_in_come_before_its_warm_process_bound_its_socket_waits_for_it(tmp_path):
    """The warm process is started as the step joins; under load torchrun's agent could
    come first, and imported torch itself (1.6 CPU-s) where it found no socket."""
    target, said, bound = (str(tmp_path / name) for name in ("warm.sock", "said", "bound"))
    proc = subprocess.Popen([sys.executable, "-u", "-c", SECOND_TRY, target, said, bound, PKG + ".procs.agent",
                             "--nnodes", "1", "train.py"], env=dict(os.environ, **{ZYGOTE_ENV: target}),
                            cwd=str(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while not os.path.exists(said) and proc.poll() is None:
            time.sleep(0.01)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(target)
        listener.listen(1)
        open(bound, "w").close()

        def serve():
            conn, _ = listener.accept()
            _, fds = recv_request(conn)
            for fd in fds:
                os.close(fd)
            conn.sendall(reply("taken", 1) + reply("pid", os.getpid()) + reply("exit", 7))
            conn.close()

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        _, err = proc.communicate(timeout=60)
        server.join(10)
        listener.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 7, err  # the warm process's child's exit: nothing ran here
