"""`pip install ARGS` into a venv, done by uv where it can be (issue 50), else by pip.

    python3 tools/install.py VENV ARGS...

A fresh clone's `make install` spent about 55 of the 60 s before its first test in
pip, most of it reading index pages one package at a time to resolve about 160
pinned and transitive requirements; uv resolves and installs the same versions in
about 5 s, the editable package in 3 (docs/development.md, "What CI takes").
uv itself is fetched once (about 4 s), at the version pinned here, into `.uv/` by
this machine's Python and pip (one process at a time, since `make install` and
`make wheel-venv` run at once in CI), not into the venv it installs into: the
package check's venv holds the wheel and its pins only.

uv reads no pip configuration, and pip's is what says where packages come from on
a machine (a wheel on disk, a mirror, a cap on torch). So the settings that choose
what gets installed are read from `pip config list` and given to uv: find-links,
constraint, index-url and extra-index-url (by environment variable: a URL may hold
a password; a `file://` index that does not exist is dropped, as pip drops it with
a warning) and cert; and, as pip does, uv takes the best version any of them
offers, not the first index's.

Where uv cannot be fetched or fails, pip installs, as before this tool (`--quiet
--no-compile`: what is imported is compiled once, by the first process that imports
it), after one line that says why. Neither compiles bytecode.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UV_VERSION = "0.13.8"
UV_HOME = os.path.join(ROOT, ".uv", UV_VERSION)
# pip's config sections that apply to `pip install`, lowest precedence first, then its
# environment variables (PIP_*), which override them.
SECTIONS = ("global", "user", "site", "install", ":env:")
# pip setting -> uv's option; the indexes (whose URLs may hold a password) go by environment
# variable instead, out of `ps` and out of the line said when uv fails.
LIST_OPTIONS = {"find-links": "--find-links", "constraint": "--constraint"}
INDEX_VARIABLES = {"index-url": "UV_INDEX_URL", "extra-index-url": "UV_EXTRA_INDEX_URL"}  # space-separated


def pip_settings(listing: str) -> Dict[str, str]:
    """`pip config list` -> {setting: value}, the one that wins for `pip install`."""
    found: Dict[str, Tuple[int, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        rank = SECTIONS.index(section)
        if name not in found or rank >= found[name][0]:
            found[name] = (rank, _unquote(value))
    return {name: value for name, (_, value) in found.items()}


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def uv_options(settings: Dict[str, str]) -> Tuple[List[str], Dict[str, str]]:
    """pip's settings as uv's command-line options and environment."""
    options: List[str] = []
    for name, flag in LIST_OPTIONS.items():
        for value in settings.get(name, "").split():
            options += [flag, value]
    env: Dict[str, str] = {}
    for name, variable in INDEX_VARIABLES.items():
        urls = [url for url in settings.get(name, "").split() if not _missing_file_url(url)]
        if urls:
            env[variable] = " ".join(urls)
    if options or env:  # pip takes the best version from all its sources; uv, by default, the first that has the name
        options += ["--index-strategy", "unsafe-best-match"]
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    return options, env


def _missing_file_url(value: str) -> bool:
    return value.startswith("file://") and not os.path.exists(value[len("file://"):])


def uv_binary(python: str = sys.executable) -> Optional[str]:
    """uv at UV_VERSION, fetched into UV_HOME once; None (said why) where it cannot be."""
    binary = os.path.join(UV_HOME, "bin", "uv")
    done = os.path.join(UV_HOME, ".complete")
    os.makedirs(os.path.dirname(UV_HOME), exist_ok=True)
    with open(os.path.join(os.path.dirname(UV_HOME), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # `make install` and `make wheel-venv` run at once
        if not os.path.exists(done):
            fetched = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--upgrade",
                                      "--target", UV_HOME, "uv==%s" % UV_VERSION],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if fetched.returncode != 0 or not os.access(binary, os.X_OK):
                say("uv %s could not be fetched (%s); pip installs instead"
                    % (UV_VERSION, _last_line(fetched.stdout)))
                return None
            open(done, "w").close()
    return binary


def install(venv: str, args: Sequence[str]) -> int:
    python = os.path.join(os.path.abspath(venv), "bin", "python")
    if not os.access(python, os.X_OK):
        say("%s is not a venv (no bin/python)" % venv)
        return 2
    uv = uv_binary()
    if uv is not None:
        listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        options, env = uv_options(pip_settings(listing))
        command = [uv, "pip", "install", "--quiet", "--python", python, *options, *args]
        done = subprocess.run(command, env=dict(os.environ, **env), stderr=subprocess.PIPE, text=True)
        if done.returncode == 0:
            return 0
        sys.stderr.write(done.stderr)
        say("uv failed (exit %d: %s); pip installs instead" % (done.returncode, shlex.join(command)))
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip>=23.1"], check=False)
    return subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", *args]).returncode


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING")]
    return lines[-1].strip() if lines else "no output"


def say(line: str) -> None:
    print("tools/install.py: %s" % line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(install(sys.argv[1], sys.argv[2:]))
