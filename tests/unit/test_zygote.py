"""The node's warm process (procs/zygote.py) and its stand-ins (procs/handoff.py),
with real processes: one zygote that imports torch, stand-ins started as
torchrun starts a rank (``python -u -m <bootstrap> SCRIPT``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host.proctree import die_with_parent
from metaflow_extensions.torchrun.plugins.torchrun.host import proctree, unix_socket
from metaflow_extensions.torchrun.plugins.torchrun.procs.status import read_statuses
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import (LABELS_ENV, WORK_DIR_ENV, ZYGOTE_ENV, ZYGOTE_NAME,
                                                                       ZYGOTE_PID_SUFFIX)
from metaflow_extensions.torchrun.plugins.torchrun.procs.zygote_wire import MAX_REQUEST, Request, ReplyReader, send_request
from metaflow_extensions.torchrun.plugins.torchrun.runtime.warm_start import WarmStart

PKG = "metaflow_extensions.torchrun.plugins.torchrun.procs"

SCRIPT = r'''
import json, os, sys, time
warm = "torch" in sys.modules
import numpy
def link(n):
    try:
        return os.readlink("/proc/self/fd/" + n)
    except OSError:  # the listing's own descriptor
        return ""
sockets = [n for n in os.listdir("/proc/self/fd") if link(n).startswith("socket:")]
umask = os.umask(0); os.umask(umask)
print(json.dumps({"warm": warm, "argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("MARK"),
                  "zygote_env": os.environ.get("ZYGOTE_NAME"), "path0": sys.path[0], "umask": umask,
                  "own_session": os.getsid(0) == os.getpid(), "sockets": sockets, "pid": os.getpid(),
                  "ppid": os.getppid(), "random": float(numpy.random.rand()),
                  "name": open("/proc/self/comm").read().strip()}), flush=True)
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "sleep":
    time.sleep(60)
if what == "raise":
    raise ValueError("boom")
sys.exit(int(what) if what.isdigit() else 0)
'''.replace("ZYGOTE_NAME", ZYGOTE_ENV)


@pytest.fixture(scope="module")
def zygote():
    directory = tempfile.mkdtemp(prefix="zyg-")
    path = os.path.join(directory, "z.sock")
    proc = subprocess.Popen([sys.executable, "-u", "-m", PKG + ".zygote", path], stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent)
    deadline = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield path, proc
    proc.kill()
    proc.wait()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "sub" / "s.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return str(path)


def _env(zygote_path, **extra):
    env = dict(os.environ, MARK="m-1", **{LABELS_ENV: "0"})
    env.pop(WORK_DIR_ENV, None)
    env.update(extra)
    if zygote_path:
        env[ZYGOTE_ENV] = zygote_path
    return env


def _start(script, args, zygote_path, cwd, **extra):
    return subprocess.Popen([sys.executable, "-u", "-m", PKG + ".bootstrap", script] + list(args),
                            env=_env(zygote_path, **extra), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _run(script, args, zygote_path, cwd, **extra):
    p = _start(script, args, zygote_path, cwd, **extra)
    out, err = p.communicate(timeout=60)
    return p.returncode, (json.loads(out.splitlines()[0]) if out.strip() else None), err


def _wait_forwarding(pid, seconds=20.0):
    """Until the stand-in catches SIGTERM: it forwards signals once the zygote told it its child's pid."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open("/proc/%d/status" % pid) as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.01)
    raise AssertionError("the stand-in never heard its child's pid")


def _gone(pid, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_forked_rank_is_what_a_fresh_one_would_be_with_torch_already_imported(zygote, script, tmp_path):
    code, warm, _ = _run(script, ["a b", "--x"], zygote[0], str(tmp_path))
    code_fresh, fresh, _ = _run(script, ["a b", "--x"], None, str(tmp_path))
    assert code == code_fresh == 0
    assert warm["warm"] is True and fresh["warm"] is False
    same = ("argv", "cwd", "env", "path0", "umask", "own_session", "zygote_env", "sockets", "name")
    assert {k: warm[k] for k in same} == {k: fresh[k] for k in same}
    assert warm["argv"] == [script, "a b", "--x"] and warm["path0"] == os.path.dirname(script)
    assert warm["zygote_env"] is None and warm["sockets"] == [] and warm["own_session"]
    assert warm["ppid"] == zygote[1].pid  # forked there, not started by the stand-in


def test_siblings_do_not_share_numpys_random_stream(zygote, script, tmp_path):
    draws = [_run(script, [], zygote[0], str(tmp_path))[1]["random"] for _ in range(2)]
    assert draws[0] != draws[1]


def test_the_stand_in_exits_as_its_child_did(zygote, script, tmp_path):
    assert _run(script, ["7"], zygote[0], str(tmp_path))[0] == 7
    code, _, err = _run(script, ["raise"], zygote[0], str(tmp_path))
    assert code == 1 and "ValueError: boom" in err and 'File "%s"' % script in err
    p = _start(script, ["sleep"], zygote[0], str(tmp_path))
    child = json.loads(p.stdout.readline())["pid"]
    p.send_signal(signal.SIGTERM)  # as torchrun stops a worker: the stand-in passes it on
    assert p.wait(timeout=20) == -signal.SIGTERM
    assert _gone(child)


EXIT_SCRIPT = r"""
import atexit, ctypes, json, os, sys, threading, time
out = sys.argv[1]
atexit.register(lambda: open(os.path.join(out, "atexit"), "w").write("ran"))
def late():
    time.sleep(0.3)
    with open(os.path.join(out, "thread"), "w") as f:
        f.write("ran")
threading.Thread(target=late).start()  # not a daemon: Python waits for it at exit
class Cycle:
    def __init__(self):
        self.me, self.f = self, open(os.path.join(out, "cycle"), "w")
        self.f.write("kept")  # buffered: what is written is what collecting the cycle at exit flushes
held = Cycle()
own = {"path": os.path.join(out, "torn_down")}  # its globals, not the script's (those must go)
exec("class TornDown:\n    def __del__(self, path=path, open=open):\n        open(path, 'w').write('yes')\n", own)
json._mftr_probe = own["TornDown"]()  # held by a module the zygote imported before the fork
ctypes.CDLL(None).printf(b"from C;")  # C's stdio: buffered on a pipe until exit
sys.stdout.write("no newline")
sys.exit(int(sys.argv[2]))
"""


def _ended(tmp_path, zygote_path, name):
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / ("exit_%s.py" % name)
    script.write_text(EXIT_SCRIPT)
    p = _start(str(script), [str(out), "3"], zygote_path, str(tmp_path))
    stdout, _ = p.communicate(timeout=60)
    return p.returncode, stdout, {f.name: f.read_text() for f in out.iterdir()}


def test_a_forked_rank_ends_as_python_would_without_tearing_down_what_it_shares(zygote, tmp_path):
    code, stdout, left = _ended(tmp_path, zygote[0], "warm")
    fresh_code, fresh_stdout, fresh_left = _ended(tmp_path, None, "fresh")
    assert code == fresh_code == 3
    assert "no newline" in stdout and "from C;" in stdout
    assert "no newline" in fresh_stdout and "from C;" in fresh_stdout
    assert {"atexit": "ran", "thread": "ran"}.items() <= left.items()
    assert left.pop("cycle") == fresh_left.pop("cycle")  # garbage collected as at a fresh exit
    # No module torn down: what the rank shares with its zygote (torch) keeps its pages.
    assert "torn_down" not in left and fresh_left == dict(left, torn_down="yes")


GROUPS_SCRIPT = r'''
import json, os, sys
import torch, torch.distributed as dist
store = dist.FileStore(os.path.join(sys.argv[1], "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
sub = dist.new_group([0])
dist.all_reduce(torch.ones(1))
default = dist.distributed_c10d._get_default_group()
dist.destroy_process_group()
keeper = sys.modules.get("metaflow_extensions.torchrun.plugins.torchrun.procs.group_keeper")
held = keeper._HELD if keeper is not None else []
print(json.dumps({"holds": getattr(dist.init_process_group, "__torchrun_holds__", False),
                  "name": dist.init_process_group.__name__,
                  "held": [any(g is x for g in held) for x in (default, sub)]}), flush=True)
'''


def test_a_warm_rank_holds_its_process_groups_past_the_script_and_a_cold_one_does_not(zygote, tmp_path):
    """torch destroys a gloo group on the script's thread with the GIL held, and a gloo worker still releasing a
    collective's tensor needs the GIL: the rank hung at its end (2 runs in 12 of the multi-host DDP test under
    load, with the warm process's optimizer import). A warm rank ends without destructors, so it holds them."""
    script = tmp_path / "groups.py"
    script.write_text(GROUPS_SCRIPT)
    for zygote_path, held in ((zygote[0], [True, True]), (None, [False, False])):
        p = _start(str(script), [str(tmp_path)], zygote_path, str(tmp_path))
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        seen = json.loads(out.splitlines()[-1])
        assert seen == {"holds": bool(zygote_path), "name": "init_process_group", "held": held}, seen


def test_the_group_keeper_holds_each_group_once_and_at_most_its_bound():
    from metaflow_extensions.torchrun.plugins.torchrun.procs import group_keeper

    saved = list(group_keeper._HELD)
    try:
        del group_keeper._HELD[:]
        groups = [object() for _ in range(group_keeper.MAX + 5)]
        for g in groups + groups[:3] + [None]:
            group_keeper.hold(g)
        assert group_keeper._HELD == groups[:group_keeper.MAX]
    finally:
        group_keeper._HELD[:] = saved


def test_a_killed_stand_in_takes_its_child_and_the_zygote_completes_the_rank_status(zygote, script, tmp_path):
    work = tempfile.mkdtemp(prefix="w-", dir=str(tmp_path))
    p = _start(script, ["sleep"], zygote[0], str(tmp_path), **{WORK_DIR_ENV: work, "RANK": "3", "LOCAL_RANK": "1"})
    child = json.loads(p.stdout.readline())["pid"]
    os.kill(child, signal.SIGKILL)  # the rank itself killed: the stand-in reports it
    assert p.wait(timeout=20) == -signal.SIGKILL
    status = read_statuses(work)[3]
    assert status.pid == child and status.exit_code == -signal.SIGKILL and status.end is not None
    p = _start(script, ["sleep"], zygote[0], str(tmp_path))
    child = json.loads(p.stdout.readline())["pid"]
    p.kill()  # torchrun's SIGKILL after its grace reaches only the stand-in
    p.wait(timeout=20)
    assert _gone(child)


def test_without_a_zygote_the_module_runs_in_the_stand_in(script, tmp_path):
    code, out, _ = _run(script, ["5"], str(tmp_path / "no.sock"), str(tmp_path))
    assert code == 5 and out["warm"] is False and out["ppid"] != 1


def _raw(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(10)
    return s


@pytest.mark.parametrize("body", [
    b"not json",
    json.dumps({"module": "os", "argv": [], "env": {}, "cwd": "/", "path": [], "umask": 18, "stand_in": 1}).encode(),
    json.dumps({"module": "bootstrap", "argv": [1], "env": {}, "cwd": "/", "path": [], "umask": 18,
                "stand_in": 1}).encode(),
    json.dumps({"module": "bootstrap", "argv": [], "env": {"A": "x\u0000y"}, "cwd": "/", "path": [],
                "umask": 18, "stand_in": 1}).encode(),
    json.dumps({"module": "bootstrap", "argv": [], "env": {}, "cwd": "/", "path": [], "umask": 4096,
                "stand_in": 1}).encode(),
])
def test_a_bad_request_is_refused_and_the_zygote_serves_on(zygote, script, tmp_path, body):
    s = _raw(zygote[0])
    s.sendall(struct.pack("!I", len(body)) + body)
    assert s.recv(100) == b""  # hung up, nothing forked
    s.close()
    assert _run(script, ["3"], zygote[0], str(tmp_path))[0] == 3


def test_an_oversized_or_silent_request_is_refused(zygote, script, tmp_path):
    s = _raw(zygote[0])
    s.sendall(struct.pack("!I", MAX_REQUEST + 1))
    assert s.recv(100) == b""
    s.close()
    with pytest.raises(ValueError):
        Request("bootstrap", ["x" * MAX_REQUEST], {}, "/", []).to_bytes()


def test_the_zygote_gone_means_the_stand_in_exits_as_killed(script, tmp_path):
    path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    zyg = subprocess.Popen([sys.executable, "-u", "-m", PKG + ".zygote", path], start_new_session=True,
                           preexec_fn=die_with_parent)
    try:
        _wait_for(path, 60)  # listening: else the stand-in runs the script itself (the fallback)
        p = _start(script, ["sleep"], path, str(tmp_path))
        child = json.loads(p.stdout.readline())["pid"]
        _wait_forwarding(p.pid)  # the stand-in has its child's pid: killed before, it would run the script itself
        zyg.kill()
        assert p.wait(timeout=20) == -signal.SIGKILL
        assert _gone(child)  # its parent-death signal
    finally:
        zyg.kill()
        zyg.wait()


def _answering(path, replies):
    """A stand-in's zygote that takes one request and answers ``replies``
    (lines), then hangs up: as a zygote that dies at that point would."""
    from metaflow_extensions.torchrun.plugins.torchrun.procs.zygote_wire import recv_request

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        _, fds = recv_request(conn)
        for fd in fds:
            os.close(fd)
        conn.sendall(b"".join(replies))
        conn.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("replies, code", [
    ([], 3),  # gone before it took the start: nothing forked, the stand-in runs the script
    ([b'{"taken": 1}\n', b'{"fresh": 1}\n'], 3),  # took it, could not fork: the stand-in runs it
    ([b'{"taken": 1}\n'], -signal.SIGKILL),  # gone as it forked: a child may have run; never run twice
])
def test_the_stand_in_runs_the_script_itself_only_where_nothing_was_forked(script, tmp_path, replies, code):
    path = str(tmp_path / "z.sock")
    server = _answering(path, replies)
    p = _start(script, ["3"], path, str(tmp_path))
    out, _ = p.communicate(timeout=60)
    server.join(10)
    assert p.returncode == code
    assert bool(out.strip()) is (code == 3)  # the script's first line ran here, or not at all


def test_the_reply_reader_refuses_what_is_not_a_reply():
    a, b = socket.socketpair()
    b.sendall(b'{"taken": 1}\n{"pid": 12}\n{"exit": -9}\n{"rm": 1}\n')
    reader = ReplyReader(a)
    assert reader.next() == {"taken": 1}
    assert reader.next() == {"pid": 12} and reader.next() == {"exit": -9}
    with pytest.raises(ValueError):
        reader.next()
    b.sendall(b"x" * 5000)
    with pytest.raises(ValueError):
        reader.next()
    a.close(), b.close()


def test_a_request_round_trips_with_its_descriptors(tmp_path):
    from metaflow_extensions.torchrun.plugins.torchrun.procs.zygote_wire import recv_request

    a, b = socket.socketpair()
    r, w = os.pipe()
    big = {"K%d" % i: "v" * 100 for i in range(2000)}  # past one datagram's worth
    sent = Request("agent", ["--nnodes", "2"], big, "/tmp", ["/x"], 0o027, 42)
    sender = threading.Thread(target=send_request, args=(a, sent, [r, w]))
    sender.start()  # more than a socket buffer: the other end reads as it comes
    got, fds = recv_request(b)
    sender.join()
    assert got == sent and len(fds) == 2
    os.write(fds[1], b"hi")
    assert os.read(r, 2) == b"hi"
    for fd in fds + [r, w]:
        os.close(fd)
    a.close(), b.close()


def _start_zygote(path, host_path):
    env = dict(os.environ)
    env.pop(ZYGOTE_ENV, None)
    if host_path:
        env[ZYGOTE_ENV] = host_path
    return subprocess.Popen([sys.executable, "-u", "-m", PKG + ".zygote", path], env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent)


def _wait_for(path, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < deadline, path
        time.sleep(0.02)


def test_a_nodes_zygote_forked_from_the_hosts_serves_warm_and_is_that_nodes_alone(zygote, script, tmp_path):
    """A local run's other nodes: their warm process is forked from the
    control's, torch imported once on the host. What it forks is its node's:
    the host zygote's own node does not count it (``not_below``)."""
    host_path, host = zygote
    path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    stand_in = _start_zygote(path, host_path)
    try:
        _wait_for(path + ZYGOTE_PID_SUFFIX)
        forked = int(open(path + ZYGOTE_PID_SUFFIX).read())
        assert forked != stand_in.pid and proctree._stat(forked)[0] == host.pid
        assert proctree._stat(forked)[2] == ZYGOTE_NAME == proctree._stat(host.pid)[2]
        code, rank, _ = _run(script, ["0"], path, str(tmp_path))
        assert code == 0 and rank["warm"] and rank["ppid"] == forked
        assert rank["name"] != ZYGOTE_NAME.decode()  # named as a fresh process is
        p = _start(script, ["sleep"], path, str(tmp_path))
        sleeper = json.loads(p.stdout.readline())["pid"]
        mine = {pid for pid, _ in proctree.descendants(forked, not_below=ZYGOTE_NAME)}
        hosts = {pid for pid, _ in proctree.descendants(host.pid, not_below=ZYGOTE_NAME)}
        assert sleeper in mine and sleeper not in hosts and forked not in hosts
        assert sleeper in {pid for pid, _ in proctree.descendants(host.pid)}  # without the rule, the host's node took it
        stand_in.kill()  # the node's task gone: its warm process and what it forked go too
        assert _gone(forked) and _gone(sleeper)
        assert p.wait(timeout=20) == -signal.SIGKILL
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_warm_process_under_a_deep_tmpdir_binds_and_serves_warm(zygote, script, tmp_path):
    """A socket path past sun_path's 107 bytes (a CI runner's TMPDIR, a test's: 128)
    used to mean no warm process at all, saying nothing: every agent and rank imported
    torch. Bound and reached through the directory's descriptor (host/unix_socket.py)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "z.sock")
    assert len(path.encode()) > unix_socket.MAX_PATH
    assert WarmStart(str(deep), None).path  # no longer given up for its length
    stand_in = _start_zygote(path, zygote[0])  # forked from the host's (connect), then binds here
    try:
        _wait_for(path + ZYGOTE_PID_SUFFIX)
        forked = int(open(path + ZYGOTE_PID_SUFFIX).read())
        _wait_for(path)
        assert stat.S_ISSOCK(os.stat(path).st_mode)  # at its own path, not under /proc
        code, rank, _ = _run(script, ["0"], path, str(tmp_path))  # a rank's stand-in connects at the deep path
        assert code == 0 and rank["warm"] and rank["ppid"] == forked
    finally:
        stand_in.kill()
        stand_in.wait()


NAMESPACED = r"""
import json, os, socket, sys
print(json.dumps({"warm": "torch" in sys.modules, "host": socket.gethostname(), "ppid": os.getppid(),
                  "net": os.stat("/proc/self/ns/net").st_ino, "mnt": os.stat("/proc/self/ns/mnt").st_ino,
                  "pid_ns": os.stat("/proc/self/ns/pid").st_ino, "marker": os.path.exists(sys.argv[1]),
                  "cwd": os.getcwd()}), flush=True)
"""
# Runs as `sh -c INNER sh DIR argv...` in new namespaces (always a UTS one: `hostname` here
# must never name the machine): a host name and a tmpfs of their own.
_INNER = 'hostname ns-test && mount -t tmpfs tmpfs "$1" && : > "$1/marker" && shift && exec "$@"'
_NAMESPACES = pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"),
                                 reason="namespaces of its own take root and unshare(1)")


def _run_unshared(tmp_path, zygote_path, *unshare):
    script, hidden = tmp_path / "ns.py", tmp_path / "hidden"
    script.write_text(NAMESPACED)
    hidden.mkdir(exist_ok=True)
    marker = hidden / "marker"
    argv = ["unshare", *unshare, "--uts", "--mount", "--propagation", "private", "sh", "-c", _INNER, "sh", str(hidden),
            sys.executable, "-u", "-m", PKG + ".bootstrap", str(script), str(marker)]
    p = subprocess.run(argv, env=_env(zygote_path), cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip(), p.stderr
    assert not marker.exists()  # the tmpfs was the namespace's alone
    return json.loads(p.stdout.splitlines()[0])


def _own(kind):
    return os.stat("/proc/self/ns/%s" % kind).st_ino


@_NAMESPACES
def test_a_stand_in_in_other_namespaces_has_its_child_forked_into_them(zygote, tmp_path):
    """A warm process reached from another network, host name and mount namespace (a
    node of the multi-host tests' hosts): its child joins the stand-in's
    (host/namespaces.py); in the zygote's own network its ranks would bind and connect
    where the node is not."""
    warm = _run_unshared(tmp_path, zygote[0], "--net")
    fresh = _run_unshared(tmp_path, None, "--net")
    assert warm["warm"] and warm["ppid"] == zygote[1].pid and not fresh["warm"]
    for seen in (warm, fresh):
        assert seen["host"] == "ns-test" and seen["marker"] and seen["cwd"] == str(tmp_path), seen
        assert seen["net"] != _own("net") and seen["mnt"] != _own("mnt"), seen


@_NAMESPACES
def test_a_stand_in_in_another_pid_namespace_starts_fresh(zygote, tmp_path):
    """A process cannot join a pid namespace itself: refused, the stand-in runs it."""
    seen = _run_unshared(tmp_path, zygote[0], "--pid", "--fork")
    assert not seen["warm"] and seen["pid_ns"] != _own("pid") and seen["marker"], seen


# A library that re-creates its native pool in every forked child, as OpenBLAS
# does: a node's zygote forked from the host's starts with that pool running.
POOL_AT_FORK = ("import _thread, os, time\n"
                "os.register_at_fork(after_in_child=lambda: _thread.start_new_thread(time.sleep, (3600,)))\n")


def test_a_nodes_zygote_forked_with_a_librarys_pool_still_forks_warm(script, tmp_path):
    """Seen on a 16-core GPU node: the node's zygote, forked from the host's,
    counted OpenBLAS's 15 re-created threads as a start-up hook's and refused
    every start, so each rank imported torch itself (2 s later than fresh)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(POOL_AT_FORK)
    host_path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    env.pop(ZYGOTE_ENV, None)
    host = subprocess.Popen([sys.executable, "-u", "-m", PKG + ".zygote", host_path], env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
    stand_in = None
    try:
        _wait_for(host_path)
        stand_in = subprocess.Popen([sys.executable, "-u", "-m", PKG + ".zygote", path],
                                    env=dict(env, **{ZYGOTE_ENV: host_path}), stdin=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
        _wait_for(path + ZYGOTE_PID_SUFFIX)
        forked = int(open(path + ZYGOTE_PID_SUFFIX).read())
        assert len(os.listdir("/proc/%d/task" % forked)) > 1  # the library's pool, re-created in it
        code, rank, _ = _run(script, ["0"], path, str(tmp_path))
        assert code == 0 and rank["warm"] and rank["ppid"] == forked
    finally:
        for p in (stand_in, host):
            if p is not None:
                p.kill()
                p.wait()


def test_with_no_host_zygote_a_nodes_zygote_imports_torch_itself(script, tmp_path):
    path = tempfile.mkdtemp(prefix="zyg-") + "/z.sock"
    zyg = _start_zygote(path, path + ".nobody")
    try:
        _wait_for(path)
        code, rank, _ = _run(script, ["0"], path, str(tmp_path))
        assert code == 0 and rank["warm"] and rank["ppid"] == zyg.pid
        assert not os.path.exists(path + ZYGOTE_PID_SUFFIX)
    finally:
        zyg.kill()
        zyg.wait()


@pytest.mark.skipif(os.getuid() != 0, reason="listening as another user takes root")
def test_a_zygote_of_another_user_is_never_handed_a_start(script, tmp_path):
    """``ZYGOTE_ENV`` comes from the environment: a socket there that another
    user listens on gets nothing (not our environment, not our descriptors),
    and the rank starts fresh."""
    directory = tempfile.mkdtemp(prefix="zyg-", dir="/tmp")  # where the other user can reach
    os.chmod(directory, 0o777)
    path = os.path.join(directory, "z.sock")
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: no exec (this interpreter is under root's home)
        try:
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.bind(path)
            s.listen(1)
            s.settimeout(30)
            conn, _ = s.accept()
            conn.settimeout(5)
            try:
                got = len(conn.recv(1 << 20))
            except OSError:
                got = -1
            os.write(report_w, b"%d" % got)
        finally:
            os._exit(0)
    os.close(report_w)
    try:
        _wait_for(path)
        code, rank, _ = _run(script, ["0"], path, str(tmp_path))
        assert code == 0 and not rank["warm"]  # ran in the stand-in itself
        assert os.read(report_r, 64) == b"0"  # hung up on, sent nothing
    finally:
        os.close(report_r)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)


# A script that never closes its log, and defines a function: its namespace is
# then held in a cycle, which runpy left to the collector, which may close the
# file's buffer before its text layer (CPython bpo-17852): the last line was lost.
UNCLOSED = '''
import sys
log = open(sys.argv[1], "w")
def where():
    return log
log.write("head\\n")
log.write("tail\\n")
'''


def test_a_file_the_script_never_closed_keeps_its_last_writes_forked_or_fresh(zygote, tmp_path):
    script = tmp_path / "unclosed.py"
    script.write_text(UNCLOSED)
    for warm in (zygote[0], None):
        out = tmp_path / ("warm.log" if warm else "fresh.log")
        code, _, err = _run(str(script), [str(out)], warm, str(tmp_path))
        assert code == 0, err
        assert out.read_text() == "head\ntail\n", ("warm" if warm else "fresh", err)


REAPED_THEN_HUNG_UP = r'''
import os, socket, subprocess, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from metaflow_extensions.torchrun.plugins.torchrun.procs.zygote import Server
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(os.path.join(tempfile.mkdtemp(), "z.sock"))
listener.listen()
server = Server(listener)
other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # the reaped child's pid, now another's
server._stand_in_gone(other.pid)  # its stand-in's hang-up, in the same batch of events as the reaping
time.sleep(0.3)
print(other.poll())
other.kill()
other.wait()
'''


def test_a_stand_in_hanging_up_after_its_child_was_reaped_signals_nothing():
    """The pid of a child the zygote reaped may already be another process's."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", REAPED_THEN_HUNG_UP, root], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "None", out.stdout + out.stderr
