"""Issue 13, items 5 to 7, end to end: private files and nothing left behind,
arguments verbatim even when they look like torchrun's options, and bad
entrypoints refused before anything starts."""

import os
import stat

import pytest

import other_user
from our_processes import node_tasks

from .calls import LOOKALIKES, ODD
from .helpers import output
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import HOST_ZYGOTE_ENV

pytestmark = pytest.mark.integration

def test_arguments_that_look_like_torchrun_options_arrive_verbatim(calls_run):
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    argvs = calls_run.reports("lookalikes", "argv-")
    assert sorted(argvs) == [0, 1]
    for argv in argvs.values():
        assert argv == LOOKALIKES + ODD
    assert not os.path.exists("/tmp/mftr-pwned")


def test_a_directory_entrypoint_is_refused_as_one_before_the_start(refusals_run):
    # The call's entrypoint "scripts/" (refusals.REFUSALS["directory"]), caught in the shared run's step.
    message = refusals_run.message("directory")
    assert "entrypoint 'scripts/' is a directory" in message
    assert "does not exist" not in message
    refusals_run.check_nothing_started()


def test_a_non_python_entrypoint_is_refused_before_the_start(refusals_run):
    # refusals.REFUSALS["not python"], caught in the shared run's step.
    message = refusals_run.message("not python")
    assert "entrypoint 'scripts/not_python.sh' is not valid Python" in message
    assert "line 3" in message
    refusals_run.check_nothing_started()


def _tree(path):
    found = {}
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(top, name)
            found[os.path.relpath(p, path)] = os.lstat(p)
    return found


def test_files_are_private_and_nothing_is_left_behind(gang, tmp_path):
    """Run with its own TMPDIR. As root, a second user first plants a symlink
    where our directory goes; it must not be followed. Afterwards: every
    directory 0700 and file 0600, ours; the work directories and torchelastic's
    gone; the other user can read nothing; and TMPDIR holds nothing of ours but
    that directory (report.py builds no optimizer: torch's compiler stack, which
    makes torchinductor_<user> there as it loads, is not the job's). The run's
    warm process is its own, started in this TMPDIR (not the test worker's)."""
    tmp = other_user.sticky_tmp(str(tmp_path / "tmp")) if os.geteuid() == 0 else str(tmp_path / "tmp")
    os.makedirs(tmp, exist_ok=True)
    base = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
    trap = os.path.join(tmp, "trap")
    user = None
    if not other_user.skip_reason():
        user = other_user.make_user()

        def plant():
            os.mkdir(trap, 0o777)
            os.symlink(trap, base)

        other_user.as_user(user, plant)
    else:
        print("not attacking as a second user: %s" % other_user.skip_reason())
    try:
        gang.env.pop(HOST_ZYGOTE_ENV, None)
        proc = gang.run("--script", "report.py", "--nproc", "2", env={"TMPDIR": tmp})
        assert proc.returncode == 0, output(proc)
        assert sorted(os.listdir(tmp)) == sorted([os.path.basename(base)] + (["trap"] if user else []))
        if user is not None:
            assert os.listdir(trap) == []
        assert not os.path.islink(base) and stat.S_IMODE(os.lstat(base).st_mode) == 0o700
        tree = _tree(base)
        logs = [p for p in tree if p.endswith(".log")]
        agent_logs = [p for p in logs if p.endswith("/torchrun-agent.log")]
        assert len(logs) - len(agent_logs) == 8  # 2 nodes x 2 ranks x stdout, stderr
        assert len(agent_logs) == 2  # torchrun's own log lines, one per node
        for rel, st in tree.items():
            assert st.st_uid == os.geteuid(), rel
            assert not stat.S_ISLNK(st.st_mode), rel
            want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
            assert stat.S_IMODE(st.st_mode) == want, (rel, oct(st.st_mode))
        assert os.listdir(os.path.join(base, "work")) == []  # work directories removed
        assert [n for n in os.listdir(tmp) if n.startswith("torchelastic_")] == []
        if user is not None:
            log = os.path.join(base, logs[0])

            def peek():
                seen = []
                for what in (base, os.path.dirname(log)):
                    try:
                        seen.append(os.listdir(what))
                    except PermissionError:
                        pass
                try:
                    seen.append(open(log).read())
                except PermissionError:
                    pass
                return seen

            assert other_user.as_user(user, peek) == []
    finally:
        if user is not None:
            other_user.remove_user()


def _leftovers(tmp):
    """Work directories and torchelastic's own directories still on the host."""
    base = os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
    work = os.path.join(base, "work")
    return {
        "work": os.listdir(work) if os.path.isdir(work) else [],
        "torchelastic": [n for n in os.listdir(tmp) if n.startswith("torchelastic_")],
    }


def test_a_failed_run_leaves_no_work_directory(failed_run):
    assert failed_run.proc.returncode != 0
    assert "boom from rank 2" in failed_run.text
    assert _leftovers(failed_run.tmpdir) == {"work": [], "torchelastic": []}


def test_sigterm_to_the_control_task_leaves_no_work_directory(gang, tmp_path):
    """Also the test that a SIGTERM to the control task stops everything,
    said as such (the gang fixture fails a test whose processes outlive it)."""
    import signal

    tmp = str(tmp_path / "tmp")
    os.makedirs(tmp)
    gang.env["TMPDIR"] = tmp
    proc = gang.start("--script", "spin.py", "--nproc", "1")
    try:
        gang.wait_for_reports("ready-", 2, timeout=120)
        # Per node while it runs: the call's, and the step's warm process's (its socket);
        # and the run's warm process's, which Metaflow's runtime holds for its local tasks.
        assert len(_leftovers(tmp)["work"]) == 5
        control = node_tasks(proc.pid, control=True)
        assert control, "control task not found"
        os.kill(control[0], signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode != 0, text
    assert "SIGTERM" in text, text[-3000:]
    assert _leftovers(tmp) == {"work": [], "torchelastic": []}
