"""What ps shows for a process of ours (host/title.py) and for a rank
(bootstrap.show_command): each case in a fresh interpreter, read back from its
own /proc, as ps reads it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host import title

_READ = """
import json, os
def seen():
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read()
    with open("/proc/self/comm", "rb") as f:
        comm = f.read().strip().decode()
    with open("/proc/self/environ", "rb") as f:
        environ = f.read()
    return cmdline, comm, environ
def say(**kw):
    print("@@" + json.dumps(kw))
"""


def run(code: str, *args: str, env_extra=None) -> dict:
    import os

    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([sys.executable, "-c", _READ + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [line[2:] for line in proc.stdout.splitlines() if line.startswith("@@")]
    return json.loads(lines[-1])


def test_a_title_shows_as_the_command_line_and_the_environment_stays_whole():
    seen = run("""
        from metaflow_extensions.torchrun.plugins.torchrun.host import title
        _, _, environ = seen()
        ready = title.prepare()
        os.environ["ADDED"] = "1"                     # the environment changes after the setup ...
        os.environ.pop("HOME", None)
        shown = title.show(["/usr/bin/python", "-u", "train.py", "--lr", "0.1"], "train.py")
        cmdline, comm, after = seen()
        say(ready=ready, shown=shown, cmdline=title.command_line(os.getpid()), comm=comm,
            environ_whole=after == environ, noenv_left="SPT_NOENV" in os.environ)
    """, "x" * 80)
    assert seen == {"ready": True, "shown": True, "cmdline": "/usr/bin/python -u train.py --lr 0.1",
                    "comm": "train.py", "environ_whole": True, "noenv_left": False}


def test_a_title_longer_than_the_original_command_line_is_cut_there():
    seen = run("""
        from metaflow_extensions.torchrun.plugins.torchrun.host import title
        original, _, _ = seen()
        title.show(["python", "-u", "train.py"] + ["--flag-%d" % i for i in range(400)], "train.py")
        say(area=len(original), shown=title.command_line(os.getpid()))
    """, "short")
    assert seen["shown"].startswith("python -u train.py --flag-0 --flag-1")
    assert len(seen["shown"]) < seen["area"]


def test_a_forked_child_titles_itself_in_what_its_parent_prepared():
    """The zygote's case: prepared before the fork, the child's environment
    replaced (as become() replaces it) before it shows its own title."""
    seen = run("""
        from metaflow_extensions.torchrun.plugins.torchrun.host import title
        title.prepare()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            env = dict(os.environ, RANK="3")
            os.environ.clear()
            os.environ.update(env)
            title.show(["python", "-u", "child.py"], "child.py")
            _, comm, _ = seen()
            os.write(w, json.dumps([title.command_line(os.getpid()), comm]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = json.loads(os.read(r, 4096))
        _, comm, _ = seen()
        say(child=child, parent_comm=comm)
    """, " " * title.ROOM)
    assert seen["child"] == ["python -u child.py", "child.py"]
    assert seen["parent_comm"] == "python"  # prepare() names nothing


def test_without_setproctitle_the_short_name_is_still_set():
    seen = run("""
        import sys
        sys.modules["setproctitle"] = None            # a user's image without it
        from metaflow_extensions.torchrun.plugins.torchrun.host import title
        before, _, _ = seen()
        shown = title.show(["python", "-u", "train.py"], "train.py")
        after, comm, _ = seen()
        say(shown=shown, same_cmdline=after == before, comm=comm)
    """)
    assert seen == {"shown": False, "same_cmdline": True, "comm": "train.py"}


def test_room_is_blanks_where_a_title_can_be_written():
    assert title.available()
    assert title.room() == [" " * title.ROOM]


@pytest.mark.parametrize("argv, command, comm", [
    (["/w/train.py", "--lr", "0.1"], ["-u", "/w/train.py", "--lr", "0.1"], "train.py"),
    (["--mf-function", "module:Trainer.fit:mypkg.jobs", "/tmp/w"], ["-u", "mypkg.jobs:Trainer.fit"], "fit"),
    (["--mf-function", "path:train:/home/u/flow.py", "/tmp/w"], ["-u", "/home/u/flow.py:train"], "train"),
    (["/w/a-very-long-script-name.py"], ["-u", "/w/a-very-long-script-name.py"], "a-very-long-scr"),
])
def test_a_rank_shows_the_command_torchrun_would_have_run(argv, command, comm):
    """bootstrap.show_command, in a fresh rank (the path without a warm process)."""
    seen = run("""
        import sys
        from metaflow_extensions.torchrun.plugins.torchrun.procs import bootstrap
        from metaflow_extensions.torchrun.plugins.torchrun.host import title
        title.prepare()
        shown = bootstrap.show_command(json.loads(sys.argv[1]))
        _, comm, _ = seen()
        say(shown=shown, cmdline=title.command_line(os.getpid()), comm=comm)
    """, json.dumps(argv), " " * 200)
    assert seen == {"shown": True, "cmdline": " ".join([sys.executable] + command), "comm": comm}
