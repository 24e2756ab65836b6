"""What ``ps`` shows for a running gang (issue 52): a rank forked from the
node's warm process shows the user's command and the script's name, not the
warm process's command line; an agent its torchrun command line; and
``python flow.py torchrun ps`` lists the ranks with their pids.

Each test holds its 2 x 2 job alive on a file (the ranks say they run, then
wait for ``release``) while it reads ``/proc``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from metaflow_extensions.torchrun.plugins.torchrun.launch.command import BOOTSTRAP_MODULE
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ZYGOTE_NAME

from our_processes import TOKEN_VAR, argv, processes_with_token

from .helpers import FLOWS, finish_or_explain, output, worker_warm_pid


def comm(pid: int) -> bytes:
    """b"" once it is gone (a process of the run may end while the test looks)."""
    try:
        with open("/proc/%d/comm" % pid, "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def parent(pid: int) -> int:
    with open("/proc/%d/stat" % pid, "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def environ(pid: int) -> list:
    with open("/proc/%d/environ" % pid, "rb") as f:
        return [e.decode(errors="replace") for e in f.read().split(b"\0") if e]


def torchrun_ps(gang, flow: str) -> list:
    proc = subprocess.run([sys.executable, os.path.join(FLOWS, flow), "--no-pylint", "torchrun", "ps", "--json"],
                          cwd=gang.tmp, env=gang.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert proc.returncode == 0, output(proc)[-3000:]
    return json.loads(proc.stdout)


def release(gang) -> None:
    with open(os.path.join(gang.out, "release"), "w"):
        pass


def assert_forked(pid: int) -> None:
    """What these tests are about: the process was forked from a warm process."""
    assert comm(parent(pid)) == ZYGOTE_NAME, "not forked from the warm process: %d's parent is %r" % (
        pid, comm(parent(pid)))


def test_ranks_and_agents_show_their_commands_and_torchrun_ps_lists_the_ranks(gang):
    proc = gang.start("--script", "hold.py", "--script-args", json.dumps({"lr": 0.1}), "--nodes", "2", "--nproc", "2")
    script = os.path.join(FLOWS, "scripts", "hold.py")
    try:
        ready = gang.wait_for_reports("ready-", 4, timeout=180)
        for report in ready.values():
            pid = report["pid"]
            assert_forked(pid)
            shown = argv(pid)
            assert shown[1:] == ["-u", script, "--lr", "0.1"], shown
            assert os.path.basename(shown[0]).startswith("python"), shown
            assert comm(pid) == b"hold.py"
            # Its environment is the warm process's, whole (the title did not
            # overwrite it): the first warm process's, torchrun's RANK is not there.
            env = environ(pid)
            assert env == environ(worker_warm_pid()) if worker_warm_pid() else "%s=%s" % (TOKEN_VAR, gang.token) in env
            assert not any(e.startswith("RANK=") for e in env)
        # `pgrep -f hold.py` finds the ranks alone: each rank's output relay is titled its own way.
        ours = processes_with_token(gang.token)
        assert {p for p in ours if script in " ".join(argv(p))} == {r["pid"] for r in ready.values()}
        relays = {" ".join(argv(p)) for p in ours if comm(p) == b"mftr-relay"}
        assert relays == {"mftr-relay rank %d" % rank for rank in ready}, relays
        agents = [p for p in ours if argv(p)[:1] == ["torchrun"]]
        assert len(agents) == 2, [argv(p) for p in processes_with_token(gang.token)]
        for pid in agents:
            assert_forked(pid)
            shown = argv(pid)
            assert ["--nnodes", "2"] == shown[1:3] and "--nproc-per-node" in shown, shown
            assert shown[-3:-1] == ["--module", BOOTSTRAP_MODULE], shown
            assert comm(pid) == b"pt_elastic"  # torch's run names its agent's main thread so, fresh or forked
        rows = torchrun_ps(gang, "gang_flow.py")  # other runs of this flow on the host too, each its own
        run = [r["run_id"] for r in rows if r["pid"] == ready[0]["pid"]]
        rows = [r for r in rows if r["run_id"] in run]
        assert sorted((r["node"], r["rank"], r["pid"]) for r in rows) == sorted(
            (rank // 2, rank, report["pid"]) for rank, report in ready.items()), rows
        assert {r["command"] for r in rows} == {" ".join(argv(ready[0]["pid"]))}
        assert {r["step"] for r in rows} == {"train"}
    finally:
        release(gang)
    out = finish_or_explain(proc, gang, 180).decode(errors="replace")
    assert proc.returncode == 0, out[-4000:]


def test_function_ranks_show_the_function(gang):
    proc = gang.start("--mode", "hold", flow="function_flow.py")
    try:
        ready = gang.wait_for_reports("ready-", 4, timeout=180)
        for report in ready.values():
            pid = report["pid"]
            assert_forked(pid)
            assert argv(pid)[1:] == ["-u", "fnlib:hold"], argv(pid)
            assert comm(pid) == b"hold"
    finally:
        release(gang)
    out = finish_or_explain(proc, gang, 180).decode(errors="replace")
    assert proc.returncode == 0, out[-4000:]
