"""The warm process forks only where a fork is safe (procs/fork_guard.py), and a
rank it forks sees what a fresh one sees. Real zygotes and stand-ins; a thread
a user's start-up hook left running is a real thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import types

import pytest
from test_zygote import PKG, SCRIPT, _run, _wait_for

from metaflow_extensions.torchrun.plugins.torchrun.host.proctree import die_with_parent
from metaflow_extensions.torchrun.plugins.torchrun.procs.fork_guard import ForkGuard, tasks
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ZYGOTE_ENV

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _zygote(path, out=subprocess.DEVNULL, **env):
    environ = dict(os.environ, **env)
    environ.pop(ZYGOTE_ENV, None)
    proc = subprocess.Popen([sys.executable, "-u", "-m", PKG + ".zygote", path], env=environ, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
    _wait_for(path)
    return proc


@pytest.fixture
def rank_script(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(SCRIPT)
    return str(path)


# -- what the guard looks at ------------------------------------------------------------


def _torch(cuda_on=False, group=False):
    cuda = types.SimpleNamespace(is_initialized=lambda: cuda_on)
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: group)
    return {"torch": types.SimpleNamespace(cuda=cuda), "torch.distributed": dist}


def _quiet_guard():
    """A guard as a zygote's would be, in this (threaded) test process."""
    guard = ForkGuard()
    guard.at_start = frozenset({os.getpid()})
    guard.own = tasks()
    return guard


def test_cuda_or_a_process_group_in_the_warm_process_refuses_the_fork():
    guard = _quiet_guard()
    assert guard.hazard(_torch(cuda_on=True)) == "CUDA is initialized in the warm process"
    assert "process group" in guard.hazard(_torch(group=True))
    assert guard.hazard(_torch()) is None and guard.hazard({}) is None


def test_a_torch_whose_check_raises_is_not_taken_as_safe():
    def broken():
        raise RuntimeError("bad fork")

    modules = {"torch": types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=broken))}
    assert _quiet_guard().hazard(modules).startswith("torch.cuda.is_initialized() failed: bad fork")


THREADS = textwrap.dedent("""
    import _thread, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from metaflow_extensions.torchrun.plugins.torchrun.procs.fork_guard import ForkGuard
    guard = ForkGuard()
    import numpy  # its BLAS pool: a thread of the zygote's own imports
    guard.warmed()
    said = [guard.hazard(sys.modules)]
    _thread.start_new_thread(time.sleep, (60,))  # native as far as threading knows: not in enumerate()
    time.sleep(0.2)
    said.append(guard.hazard(sys.modules))
    threading.Thread(target=time.sleep, args=(60,), name="user-worker", daemon=True).start()
    said.append(guard.hazard(sys.modules))
    print(repr(said))
""")


def test_a_thread_the_warm_process_did_not_start_refuses_the_fork(tmp_path):
    out = subprocess.run([sys.executable, "-c", THREADS, PKG_ROOT], capture_output=True, text=True, timeout=60)
    said = eval(out.stdout)  # noqa: S307 (our own repr of a list of str/None)
    assert said[0] is None, said  # the imports' own threads are the baseline
    assert said[1].startswith("1 native threads started since the warm process imported torch"), said
    assert said[2] == "Python threads are running in the warm process: user-worker"


# -- a real zygote that must not fork ---------------------------------------------------

HOOKS = {
    "native": "import _thread, time\n_thread.start_new_thread(time.sleep, (3600,))\n",
    "python": "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_zygote_a_start_up_hook_left_a_thread_in_refuses_and_the_rank_starts_fresh(hook, rank_script, tmp_path):
    """A ``sitecustomize`` that starts a thread as Python starts (an OpenMP
    pool, a monitoring agent): every start is refused, the zygote's log says
    why, and the rank runs fresh, as it would with no zygote."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOKS[hook])
    path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    log = tmp_path / "zygote.log"
    with open(log, "wb") as out:
        zyg = _zygote(path, out, PYTHONPATH=str(hooks))
    try:
        for _ in range(2):
            code, rank, _ = _run(rank_script, ["0"], path, str(tmp_path))
            assert code == 0 and rank["warm"] is False and rank["ppid"] != zyg.pid
        said = log.read_text()
        assert said.count("a start refused, the stand-in starts fresh: 1 threads were running before the warm "
                          "process imported anything (a sitecustomize or .pth hook started them)") == 2, said
    finally:
        zyg.kill()
        zyg.wait()


# -- a forked rank sees what a fresh one sees ---------------------------------------------

VIEW = r'''
import json, os, sys
forked = "torch" in sys.modules
import torch
# NVML as a node with 8 GPUs would answer it: torch's own count then reads this
# rank's CUDA_VISIBLE_DEVICES, as on a GPU node (no CUDA is initialised).
torch.cuda._is_compiled = lambda: True
torch.cuda._raw_device_count_nvml = lambda: 8
print(json.dumps({"forked": forked, "argv": sys.argv, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "local_rank": os.environ.get("LOCAL_RANK"), "rank": os.environ.get("RANK"),
                  "count": torch.cuda.device_count(), "initialized": torch.cuda.is_initialized(),
                  "cached": torch.cuda._cached_device_count,
                  "env": sorted(k for k in os.environ if k.startswith(("CUDA", "LOCAL_", "NCCL", "TORCH")))}),
      flush=True)
'''


def test_a_forked_ranks_devices_local_rank_and_argv_are_a_fresh_ones(tmp_path):
    """The warm process imported torch under the node's environment; each rank
    it forks has its own ``CUDA_VISIBLE_DEVICES`` and ``LOCAL_RANK``, and
    torch counts its devices from them, exactly as in a rank started fresh."""
    view = tmp_path / "view.py"
    view.write_text(VIEW)
    path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    zyg = _zygote(path, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")  # the node's, as the task had it
    try:
        for local, visible, rank in [("0", "2,3", "0"), ("1", "5", "1"), ("2", "", "2")]:
            env = {"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": local, "RANK": rank}
            code, warm, _ = _run(str(view), ["--lr", "0.1", local], path, str(tmp_path), **env)
            code_fresh, fresh, _ = _run(str(view), ["--lr", "0.1", local], None, str(tmp_path), **env)
            assert code == code_fresh == 0 and warm.pop("forked") and not fresh.pop("forked")
            assert warm == fresh, json.dumps({"forked": warm, "fresh": fresh})
            assert warm["count"] == len([d for d in visible.split(",") if d]) and warm["local_rank"] == local
            assert warm["argv"] == [str(view), "--lr", "0.1", local] and not warm["initialized"]
    finally:
        zyg.kill()
        zyg.wait()
