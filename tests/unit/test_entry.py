"""entry.py: the script and its arguments reach the bootstrap out of torchrun's
sight, so torchrun's parser never takes one of them for its own option (issue 13,
item 6), and torchrun's own temporary files stay in the work directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.procs import bootstrap, entry
from plans import agent_environment
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import BOOTSTRAP_MODULE, Launch, build_command

# Prefixes of torchrun's own options (issue 13, item 6), its options themselves
# and the things a shell or a parser would change.
TORCHRUN_LOOKALIKES = [
    "--log", "--max", "--start", "--run", "--master", "--local", "--monitor",
    "--rdzv", "--no", "--e",
    "--nnodes", "--nproc-per-node=64", "--master-port", "29500", "--module", "-m",
    "--standalone", "--help", "-h", "--", "-",
]
ODD = ["has space", "quote ' and \" both", "$(touch /tmp/x)", "ünïcödé ✓", "", "a=b", "\t", "-5"]
ARGV = ["/abs/train.py"] + TORCHRUN_LOOKALIKES + ODD


def test_round_trip_and_private(tmp_path):
    path = entry.write_entry(str(tmp_path), ARGV)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert entry.read_entry(path) == (ARGV, True, True)


def test_never_overwrites_or_follows(tmp_path):
    (tmp_path / "elsewhere").write_text("x")
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / entry.ENTRY_FILE))
    with pytest.raises(OSError):
        entry.write_entry(str(tmp_path), ARGV)
    assert (tmp_path / "elsewhere").read_text() == "x"


def test_torchruns_parser_sees_no_user_argument(tmp_path):
    """The command the call builds ends with the bootstrap and the entry file."""
    path = entry.write_entry(str(tmp_path), ARGV)
    argv = build_command(Launch(
        python=sys.executable, num_nodes=2, node_index=0, nproc_per_node=1,
        rdzv_host="127.0.0.1", rdzv_port=1234, rdzv_id="x", entrypoint=path,
    ))
    assert argv[-3:] == ["--module", BOOTSTRAP_MODULE, path]
    assert not any(token in argv for token in TORCHRUN_LOOKALIKES[:10])
    assert path.startswith("/")  # a path never looks like an option


def test_bootstrap_entry(tmp_path):
    path = entry.write_entry(str(tmp_path), ARGV, trainer_progress=False, arrivals=False)
    env = {entry.ENTRY_ENV: path}
    assert entry.bootstrap_entry([path], env) == (ARGV, False, False)  # the step's settings come with it
    assert entry.bootstrap_entry(["/abs/train.py", "--x"], env) == (["/abs/train.py", "--x"], True, True)
    assert entry.bootstrap_entry([path], {}) == ([path], True, True)


def test_agent_environment_and_the_ranks_tmpdir(tmp_path):
    entry.write_entry(str(tmp_path), ARGV)  # with the agent's TMPDIR beside it
    env = agent_environment({"TMPDIR": "/scratch", "A": "1"}, str(tmp_path), "/e.json")
    assert env["TMPDIR"] == str(tmp_path / entry.AGENT_TMP) and os.path.isdir(env["TMPDIR"])
    assert env[entry.ENTRY_ENV] == "/e.json" and env["A"] == "1"
    entry.restore_user_tmpdir(env)
    assert env["TMPDIR"] == "/scratch" and entry.ENTRY_ENV not in env
    assert entry.USER_TMPDIR_ENV not in env
    unset = agent_environment({}, str(tmp_path), "/e.json")
    entry.restore_user_tmpdir(unset)
    assert "TMPDIR" not in unset


def test_a_rank_runs_the_script_from_the_entry_file(tmp_path):
    """The real bootstrap, as torchrun starts it: ``-m bootstrap <entry file>``."""
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys, tempfile\n"
        "json.dump({'argv': sys.argv, 'tmpdir': os.environ.get('TMPDIR'),\n"
        "           'gettempdir': tempfile.gettempdir(),\n"
        "           'ours': sorted(k for k in os.environ if k.startswith('METAFLOW_TORCHRUN_ENTRY')\n"
        "                          or k == 'METAFLOW_TORCHRUN_USER_TMPDIR')},\n"
        "          open(os.environ['REPORT'], 'w'))\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    user_tmp = tmp_path / "user-tmp"
    user_tmp.mkdir()
    path = entry.write_entry(str(work), [str(script)] + TORCHRUN_LOOKALIKES + ODD)
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "TORCHELASTIC_ERROR_FILE")}
    base.update({"TMPDIR": str(user_tmp), "REPORT": str(tmp_path / "report.json"),
                 bootstrap.WORK_DIR_ENV: str(work), bootstrap.LABELS_ENV: "0", "RANK": "0"})
    env = agent_environment(base, str(work), path, label_logs=False)
    proc = subprocess.run([sys.executable, "-m", BOOTSTRAP_MODULE, path], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["argv"] == [str(script)] + TORCHRUN_LOOKALIKES + ODD
    assert report["tmpdir"] == str(user_tmp) and report["gettempdir"] == str(user_tmp)
    assert report["ours"] == []


def test_unreadable_entry_file_is_a_clear_error(tmp_path):
    path = str(tmp_path / "entry.json")
    with open(path, "w") as f:
        f.write("{not json")
    env = dict(os.environ, **{entry.ENTRY_ENV: path, bootstrap.LABELS_ENV: "0"})
    proc = subprocess.run([sys.executable, "-m", BOOTSTRAP_MODULE, path], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "cannot read what to run" in proc.stderr


def test_a_million_arguments_reach_the_rank(tmp_path):
    """Item 7: they used to fail with E2BIG after the start; through the entry
    file they are no concern of the command line."""
    script = tmp_path / "count.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--log'] * 1_000_000, len(sys.argv)\n")
    path = entry.write_entry(str(tmp_path), [str(script)] + ["--log"] * 1_000_000)
    env = dict(os.environ, **{entry.ENTRY_ENV: path, bootstrap.LABELS_ENV: "0"})
    proc = subprocess.run([sys.executable, "-m", BOOTSTRAP_MODULE, path], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
