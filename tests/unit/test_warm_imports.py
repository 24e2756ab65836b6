"""What the node's warm process learns from a rank's first step (procs/warm_imports.py) and how it
imports it (procs/zygote.py's warmer): which modules are the user's, by where their files are;
nothing of the user's imported; an import that fails, hangs or starts a thread leaves the restart
on the plain path. Real zygotes here (a torch of nothing, to stay fast: torch's own import is not
what is tested) with a site-packages of the test's own (``PYTHONUSERBASE``'s)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import sysconfig
import time
import types

import pytest

import our_processes

from metaflow_extensions.torchrun.plugins.torchrun.host import proctree
from metaflow_extensions.torchrun.plugins.torchrun.host.proctree import die_with_parent
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import LABELS_ENV, WORK_DIR_ENV, ZYGOTE_ENV, ZYGOTE_SOCKET
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ENTRY_ENV
from metaflow_extensions.torchrun.plugins.torchrun.procs.warm_imports import (MAX_MODULES, WARMER_SUFFIX, asked,
                                                                              import_learned, leaves, script_changed,
                                                                              third_party)
from metaflow_extensions.torchrun.plugins.torchrun.procs.zygote_wire import Request, send_request
from metaflow_extensions.torchrun.plugins.torchrun.runtime.warm_start import WarmStart

PKG = "metaflow_extensions.torchrun.plugins.torchrun.procs"


def _mod(path):
    return types.SimpleNamespace(__file__=path)


# -- which modules: by where their files are ---------------------------------------------------

def test_a_module_is_third_party_by_its_directory_the_deepest_deciding():
    site = "/proj/.venv/lib/python3.11/site-packages"
    assert third_party(site + "/transformers/trainer.py", [site], ["/proj"])  # a venv inside the project
    assert not third_party("/proj/train.py", [site], ["/proj"])
    assert not third_party("/opt/libs/mine.py", [site], ["/proj"])  # PYTHONPATH, not site-packages
    assert third_party(site + "/x.py", [site], ["/"])  # a working directory of /
    assert not third_party(site + "/vendored/x.py", [site], [site + "/vendored"])  # user code inside it
    assert not third_party(site + "-other/x.py", [site], [])  # a prefix of a name is not a directory


def test_the_leaves_in_site_packages_in_their_order_the_warm_processes_own_and_ours_left_out():
    site, user = "/venv/site-packages", "/work/flow"
    modules = {
        "torch": _mod(site + "/torch/__init__.py"),
        "transformers": _mod(site + "/transformers/__init__.py"),
        "transformers.utils": _mod(site + "/transformers/utils/__init__.py"),
        "transformers.utils.hub": _mod(site + "/transformers/utils/hub.py"),
        "yaml": _mod(site + "/yaml/__init__.py"),
        "mylib": _mod(user + "/mylib.py"),  # the user's own: never sent
        "metaflow": _mod(site + "/metaflow/__init__.py"),  # Metaflow's and ours: never
        "metaflow_extensions.torchrun.x": _mod(site + "/metaflow_extensions/torchrun/x.py"),
        "google": types.SimpleNamespace(__file__=None),  # a namespace package: its leaves say it
        "google.protobuf": _mod(site + "/google/protobuf/__init__.py"),
        "sys": types.SimpleNamespace(),  # built in
    }
    got = leaves(modules, [site], [user], known={"torch"})
    assert got == ["transformers.utils.hub", "yaml", "google.protobuf"]


def test_the_leaves_are_bounded():
    site = "/s"
    modules = {"m%d" % i: _mod("/s/m%d.py" % i) for i in range(MAX_MODULES + 10)}
    assert leaves(modules, [site], []) == ["m%d" % i for i in range(MAX_MODULES)]


def test_what_the_bootstrap_and_torch_set_is_not_the_scripts_change():
    then = {"A": "1", "TMPDIR": "/agent-tmp", ENTRY_ENV: "/w/entry.json"}
    now = {"A": "1", "TMPDIR": "/user-tmp", "TORCHINDUCTOR_CACHE_DIR": "/user-tmp/torchinductor_me"}
    assert script_changed(now, then) == []
    assert script_changed(dict(now, HF_HUB_OFFLINE="1"), then) == ["HF_HUB_OFFLINE"]
    assert script_changed({"TMPDIR": "/user-tmp"}, then) == ["A"]  # unset counts too


def test_an_offer_is_read_as_hostile():
    argv = ["transformers.trainer", "os.system('x')", "a..b", "", "metaflow.cli", "metaflow_extensions.x",
            "x" * 300, "ok_1.sub"]
    assert asked(argv) == ["transformers.trainer", "ok_1.sub"]
    assert len(asked(["m"] * (MAX_MODULES + 5))) == MAX_MODULES


# -- importing them: nothing of the user's --------------------------------------------------------

def _package(root, name, body=""):
    path = root / name
    path.mkdir(parents=True)
    (path / "__init__.py").write_text(body)
    return path


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    site, user = tmp_path / "site", tmp_path / "user"
    site.mkdir()
    user.mkdir()
    marker = tmp_path / "imported-user-code"
    spy = "open(%r, 'a').write(__name__ + '\\n')\n" % str(marker)
    _package(site, "wi_third")
    (site / "wi_third" / "sub.py").write_text("VALUE = 'site'\n")
    _package(site, "wi_shadow", "FROM = 'site'\n")
    _package(user, "wi_shadow", spy + "FROM = 'user'\n")  # first on sys.path: the rank's would be this one
    (user / "wi_user.py").write_text(spy)
    _package(site, "wi_broken", "raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(user))
    yield str(site), str(user), marker
    for name in [n for n in sys.modules if n.startswith("wi_")]:
        del sys.modules[name]


def test_the_learned_modules_are_imported_from_site_packages_and_nothing_of_the_users(dirs):
    site, user, marker = dirs
    path_before = list(sys.path)
    done, skipped = import_learned(["wi_third.sub", "wi_user", "wi_shadow", "wi_broken"], [user],
                                   time.monotonic() + 60, sites=[site], system=[site])
    assert (done, skipped) == (2, 2)
    assert sys.modules["wi_third.sub"].VALUE == "site"
    assert sys.modules["wi_shadow"].FROM == "site"
    assert "wi_user" not in sys.modules and "wi_broken" not in sys.modules
    assert not marker.exists()
    assert sys.path == path_before


def test_nothing_is_imported_past_the_deadline(dirs):
    site, user, _ = dirs
    assert import_learned(["wi_third.sub"], [user], time.monotonic() - 1, sites=[site], system=[site]) == (0, 0)
    assert "wi_third" not in sys.modules


# -- the warm process: a warmer that serves, and one given up on ----------------------------------

RANK = r'''
import json, os, sys
had = sorted(m for m in sys.modules if m.startswith("wi_"))
if len(sys.argv) > 1 and sys.argv[1].startswith("offer"):
    if sys.argv[1] == "offer-after-setting":
        os.environ["WI_SETTING"] = "1"  # as a script may, for a library that reads it as it loads
    import wi_third.sub, wi_mine  # a site-packages module and one of the user's, beside this script
    from metaflow_extensions.torchrun.plugins.torchrun.procs import warm_imports
    print(json.dumps({"offered": warm_imports.offer()}), flush=True)
def link(n):
    try:
        return os.readlink("/proc/self/fd/" + n)
    except OSError:  # the listing's own descriptor
        return ""
sockets = [n for n in os.listdir("/proc/self/fd") if link(n).startswith("socket:")]
print(json.dumps({"had": had, "ppid": os.getppid(), "sockets": sockets}), flush=True)
'''


@pytest.fixture
def node(tmp_path):
    """A zygote whose interpreter has a site-packages of the test's own, and a rank's script beside a module
    of the user's; ``start(seconds)`` starts the zygote with that bound on its warmer."""
    base = tmp_path / "userbase"
    site = sysconfig.get_path("purelib", scheme="posix_user", vars={"userbase": str(base)})
    os.makedirs(site)
    fake = tmp_path / "faketorch"
    _package(fake, "torch")
    _package(fake, "torch/distributed", "def is_available():\n    return False\n")
    (fake / "torch" / "distributed" / "run.py").write_text("")
    _package(tmp_path / "s", "wi_third")
    os.replace(tmp_path / "s" / "wi_third", os.path.join(site, "wi_third"))
    with open(os.path.join(site, "wi_third", "sub.py"), "w") as f:
        f.write("")
    flow = tmp_path / "flow"
    flow.mkdir()
    (flow / "rank.py").write_text(RANK)
    (flow / "wi_mine.py").write_text("open(%r, 'a').write('x')\n" % str(tmp_path / "mine-imported"))
    env = dict(os.environ, PYTHONUSERBASE=str(base), **{LABELS_ENV: "0"})
    env["PYTHONPATH"] = os.pathsep.join([str(fake), site, env.get("PYTHONPATH", "")])
    env.pop(WORK_DIR_ENV, None)
    env.pop(ZYGOTE_ENV, None)
    started = []

    def start(seconds=60.0):
        path = str(tmp_path / ZYGOTE_SOCKET)
        code = ("import sys; from %s import warm_imports, zygote; warm_imports.SECONDS = float(sys.argv[2]); "
                "zygote.main(sys.argv[1:2])" % PKG)
        log = open(tmp_path / "zygote.log", "wb")
        proc = subprocess.Popen([sys.executable, "-u", "-c", code, path, str(seconds)], env=env, cwd=str(flow),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)
        started.append(proc)
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        return types.SimpleNamespace(path=path, proc=proc, site=site, flow=str(flow), env=env, tmp=tmp_path)

    yield start
    for proc in started:
        os.killpg(proc.pid, 9)
        proc.wait()


def _rank(z, *args):
    env = dict(z.env, LOCAL_RANK="0", TORCHELASTIC_RESTART_COUNT="0", **{ZYGOTE_ENV: z.path})
    p = subprocess.run([sys.executable, "-u", "-m", PKG + ".bootstrap", os.path.join(z.flow, "rank.py"), *args],
                       env=env, cwd=z.flow, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def _offer(z, *names):
    import socket

    request = Request(module="imports", argv=list(names), env={}, cwd=z.flow, path=[z.flow], stand_in=os.getpid(),
                      executable=sys.executable)
    deadline = time.monotonic() + 30
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        while True:
            try:
                sock.connect(z.path)  # bound, then listening: refused in between
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        send_request(sock, request, [])


def _note(z, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(z.path + WARMER_SUFFIX) as f:
                return json.load(f)
        except (OSError, ValueError):
            time.sleep(0.05)
    raise AssertionError("the warm process never said what became of its warmer")


def _task_side(z):
    """The node task's view of this zygote (runtime/warm_start.py), as if it had started it."""
    warm = WarmStart(str(z.tmp), None)
    warm.proc = z.proc
    return warm


def _warm_children(z):
    """The zygote's children that are warm processes themselves (its warmer): its ranks are not."""
    return [p for p, _ in proctree.children(z.proc.pid) if "rank.py" not in " ".join(_)]


def test_a_ranks_first_step_teaches_the_warm_process_and_the_next_rank_forks_with_it(node, caplog):
    """And the task tracks what the warmer forks (the supervisor's roots), said once in its debug log."""
    caplog.set_level(logging.DEBUG, logger="metaflow_torchrun")
    z = node()
    task = _task_side(z)
    assert task.pids == (z.proc.pid,)
    first = _rank(z, "offer")
    assert first[0] == {"offered": True} and first[1]["had"] == [] and first[1]["ppid"] == z.proc.pid
    note = _note(z)
    assert note["modules"] >= 1 and note["skipped"] == 0, note  # wi_third.sub, not the user's wi_mine
    second = _rank(z)[0]
    assert second["had"] == ["wi_third", "wi_third.sub"] and second["ppid"] == note["pid"]
    assert second["sockets"] == []  # none of the warm processes' own, as in a rank forked by the first
    assert (z.tmp / "mine-imported").read_text() == "x"  # the first rank's own import, once
    assert task.pids == task.pids == (z.proc.pid, note["pid"])
    assert our_processes.argv(note["pid"]) == our_processes.argv(z.proc.pid)  # how the tests tell it from a node's
    assert [r.getMessage() for r in caplog.records].count(
        "the warm process imported what the ranks had loaded by their first step (%d modules, %s s): a restart's "
        "ranks fork with it" % (note["modules"], note["seconds"])) == 1, caplog.text
    with open(z.tmp / "zygote.log") as f:
        said = f.read()
    assert said.count("it forks this node's agents and ranks from now on") == 1, said


def test_a_rank_whose_script_changed_its_environment_teaches_nothing(node):
    """A library may have read the change as it loaded; the warm process would import in the task's."""
    z = node()
    assert _rank(z, "offer-after-setting")[0] == {"offered": False}
    assert not os.path.exists(z.path + WARMER_SUFFIX)
    assert _rank(z)[0]["had"] == []


def _site_module(z, name, body):
    with open(os.path.join(z.site, name + ".py"), "w") as f:
        f.write(body)


@pytest.mark.parametrize("case, body, why", [
    ("hang", "import time\ntime.sleep(3600)\n", "still importing after 2 s"),
    ("thread", "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
     "threads are running"),
    ("crash", "import os\nos._exit(3)\n", "ended before it was done"),
])
def test_a_warmer_that_hangs_or_is_not_fit_to_fork_leaves_the_restart_on_the_plain_path(node, case, body, why):
    """The rank that comes meanwhile waits in the backlog, then is forked as before, once the warm process has
    given up on its warmer (killed it), said once in its log and beside its socket (the task's debug log)."""
    z = node(seconds=2.0)
    task = _task_side(z)
    _site_module(z, "wi_" + case, body)
    _offer(z, "wi_" + case)
    rank = _rank(z)[0]
    assert rank["had"] == [] and rank["ppid"] == z.proc.pid
    note = _note(z)
    assert why in note["gave_up"], note
    deadline = time.monotonic() + 10
    while _warm_children(z) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _warm_children(z) == []
    assert task.pids == (z.proc.pid,)
    with open(z.tmp / "zygote.log") as f:
        said = f.read()
    assert said.count("fork from this process, as before") == 1, said
