"""A second, unprivileged user for the tests of private files.

As root the tests make one (``useradd``) and remove it at the end of the session;
otherwise they are skipped, with the reason printed. ``as_user`` runs a Python
function in a forked child that has dropped to that user (fork, not exec: the
test's interpreter may live where that user cannot read).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import traceback
from typing import Any, Callable, Tuple

import pytest

NAME = "mftr-other-%d" % os.getpid()


def skip_reason() -> str:
    if os.geteuid() != 0:
        return "not root: cannot make a second user to attack our files with"
    if shutil.which("useradd") is None:
        return "no useradd on this machine: cannot make a second user"
    return ""


def make_user() -> Tuple[int, int]:
    reason = skip_reason()
    if reason:
        print("SKIPPED: %s" % reason)
        pytest.skip(reason)
    try:
        pw = pwd.getpwnam(NAME)
    except KeyError:
        proc = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            reason = "useradd failed: %s" % proc.stderr.strip()
            print("SKIPPED: %s" % reason)
            pytest.skip(reason)
        pw = pwd.getpwnam(NAME)
    return pw.pw_uid, pw.pw_gid


def remove_user() -> None:
    try:
        pwd.getpwnam(NAME)
    except KeyError:
        return
    subprocess.run(["userdel", NAME], capture_output=True)


def as_user(user: Tuple[int, int], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as ``user``; its return value (repr-able) or its exception
    (re-raised here as AssertionError with the child's traceback)."""
    import pickle

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
            try:
                payload = pickle.dumps(("ok", fn(*args)))
                code = 0
            except BaseException as e:  # noqa: BLE001
                payload = pickle.dumps(("error", "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
            with os.fdopen(w, "wb") as f:
                f.write(payload)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError("as the other user: %s" % value)
    return value


def sticky_tmp(path: str) -> str:
    """A directory like /tmp: everyone may create, only owners may remove."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o1777)
    # The path to it must be traversable by the other user.
    walk = os.path.abspath(path)
    while walk != "/":
        walk = os.path.dirname(walk)
        mode = os.stat(walk).st_mode
        if not mode & 0o001:
            os.chmod(walk, mode | 0o001)
    return path
