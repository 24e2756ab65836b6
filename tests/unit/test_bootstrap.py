"""bootstrap.py run as every rank runs it: ``python -m <bootstrap> script.py args...``."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import textwrap
import types

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.procs import bootstrap
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import BOOTSTRAP_MODULE
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import read_failures

REPO = pathlib.Path(__file__).resolve().parents[2]

# Script that reports what it sees, as JSON, to the file named by REPORT.
REPORT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import sibling_helper
    report = {
        "argv": sys.argv,
        "name": __name__,
        "file": __file__,
        "sibling": sibling_helper.VALUE,
        "path0": sys.path[0],
    }
    MARKER = 42  # visible through sys.modules["__main__"] only if that is this module
    report["main_is_me"] = sys.modules["__main__"].__dict__.get("MARKER") == 42
    with open(os.environ["REPORT"], "w") as f:
        json.dump(report, f)
    """
)


def rank_env(failure_dir, **extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "TORCHELASTIC_ERROR_FILE", "PYTHONPATH")
    }
    env.update(
        {
            bootstrap.WORK_DIR_ENV: str(failure_dir),
            "RANK": "3",
            "LOCAL_RANK": "1",
            bootstrap.NODE_INDEX_ENV: "1",
            # Output labels are tested on their own (TestLabels); here output
            # must come through exactly as the script wrote it.
            bootstrap.LABELS_ENV: "0",
        }
    )
    env.update(extra)
    return env


def run_rank(script, *args, env, cwd=REPO, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", BOOTSTRAP_MODULE, str(script), *args],
        cwd=str(cwd),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def workdir(tmp_path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sibling_helper.py").write_text(
        "VALUE = 'from the sibling'\n"
        "def explode(msg):\n"
        "    raise KeyError(msg)\n"
    )
    failures = tmp_path / "failures"
    failures.mkdir()
    return scripts, failures


def first_frame(stderr):
    m = re.search(r'^  File "([^"]+)", line (\d+), in (\S+)', stderr, re.M)
    assert m, stderr
    return m.group(1), int(m.group(2)), m.group(3)


class TestRunsLikePython:
    def test_argv_name_and_sibling_import(self, workdir, tmp_path):
        scripts, failures = workdir
        script = scripts / "report.py"
        script.write_text(REPORT_SCRIPT)
        report = tmp_path / "report.json"
        r = run_rank(script, "a", "b c", "$(x)", "", env=rank_env(failures, REPORT=str(report)))
        assert r.returncode == 0, r.stderr
        seen = json.loads(report.read_text())
        assert seen["argv"] == [str(script), "a", "b c", "$(x)", ""]
        assert seen["name"] == "__main__"
        assert seen["sibling"] == "from the sibling"
        assert seen["path0"] == str(scripts)
        assert seen["file"] == str(script)
        assert seen["main_is_me"] is True
        assert read_failures(str(failures)) == []

    def test_relative_script_from_another_cwd(self, workdir, tmp_path):
        scripts, failures = workdir
        (scripts / "report.py").write_text(REPORT_SCRIPT)
        report = tmp_path / "report.json"
        r = run_rank(
            "report.py", "x", env=rank_env(failures, REPORT=str(report)), cwd=scripts
        )
        assert r.returncode == 0, r.stderr
        seen = json.loads(report.read_text())
        assert seen["argv"] == ["report.py", "x"]
        assert seen["sibling"] == "from the sibling"

    def test_stdout_and_stderr_pass_through(self, workdir):
        scripts, failures = workdir
        script = scripts / "talk.py"
        script.write_text("import sys\nprint('to out')\nprint('to err', file=sys.stderr)\n")
        r = run_rank(script, env=rank_env(failures))
        assert (r.returncode, r.stdout, r.stderr) == (0, "to out\n", "to err\n")

    def test_script_defined_functions_work_with_spawned_workers(self, workdir):
        # DataLoader workers and mp.spawn pickle functions defined in __main__.
        scripts, failures = workdir
        script = scripts / "pool.py"
        script.write_text(
            textwrap.dedent(
                """
                import multiprocessing as mp

                def double(x):
                    return 2 * x

                if __name__ == "__main__":
                    with mp.get_context("spawn").Pool(1) as pool:
                        print(pool.map(double, [1, 2, 3]))
                """
            )
        )
        r = run_rank(script, env=rank_env(failures))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[2, 4, 6]"

    def test_no_script_is_a_usage_error(self, workdir):
        _, failures = workdir
        r = subprocess.run(
            [sys.executable, "-m", BOOTSTRAP_MODULE],
            cwd=str(REPO),
            env=rank_env(failures),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2
        assert "usage" in r.stderr


class TestFailures:
    def test_exception_is_recorded_and_reported(self, workdir):
        scripts, failures = workdir
        script = scripts / "fail.py"
        script.write_text(
            "import sys\n"
            "def main():\n"
            "    raise ValueError('boom')\n"
            "main()\n"
        )
        r = run_rank(script, "a", env=rank_env(failures))
        assert r.returncode == 1
        # The traceback a user would see from `python fail.py`: no runpy/bootstrap frames.
        assert first_frame(r.stderr) == (str(script), 4, "<module>")
        assert "runpy.py" not in r.stderr
        assert "bootstrap.py" not in r.stderr
        assert r.stderr.count("Traceback (most recent call last)") == 1
        assert 'line 3, in main' in r.stderr
        assert r.stderr.rstrip().endswith("ValueError: boom")

        recorded = read_failures(str(failures))
        assert len(recorded) == 1
        f = recorded[0]
        assert (f.rank, f.local_rank, f.node_index) == (3, 1, 1)
        assert (f.exc_type, f.message) == ("ValueError", "boom")
        assert f.host == socket.gethostname()
        assert f.pid > 0 and f.pid != os.getpid()
        assert f.traceback.strip() == r.stderr.strip()
        assert f.timestamp > 0

    def test_exception_in_a_sibling_module_starts_at_the_script(self, workdir):
        scripts, failures = workdir
        script = scripts / "calls.py"
        script.write_text("import sibling_helper\nsibling_helper.explode('missing')\n")
        r = run_rank(script, env=rank_env(failures))
        assert r.returncode == 1
        assert first_frame(r.stderr) == (str(script), 2, "<module>")
        assert str(scripts / "sibling_helper.py") in r.stderr
        assert "runpy.py" not in r.stderr and "bootstrap.py" not in r.stderr
        (f,) = read_failures(str(failures))
        assert f.exc_type == "KeyError" and f.message == "'missing'"

    def test_chained_exceptions_are_kept(self, workdir):
        scripts, failures = workdir
        script = scripts / "chain.py"
        script.write_text(
            "try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('wrapped') from e\n"
        )
        r = run_rank(script, env=rank_env(failures))
        assert r.returncode == 1
        assert "KeyError: 'k'" in r.stderr and "RuntimeError: wrapped" in r.stderr
        assert "direct cause" in r.stderr
        (f,) = read_failures(str(failures))
        assert f.exc_type == "RuntimeError"

    @pytest.mark.parametrize("code", ["raise SystemExit(0)", "import sys; sys.exit()", "raise SystemExit(None)"])
    def test_clean_system_exit_records_nothing(self, workdir, code):
        scripts, failures = workdir
        script = scripts / "ok.py"
        script.write_text(code + "\n")
        r = run_rank(script, env=rank_env(failures))
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        assert read_failures(str(failures)) == []
        # Only the rank's status record, saying it exited 0, and its stack file, no dump in it
        # (one line: how a dump would end, stacks.py).
        assert sorted(os.listdir(failures)) == ["rank-3.stacks.txt", "rank-3.status.json"]
        assert (failures / "rank-3.stacks.txt").read_text().count("\n") == 1
        status = json.loads((failures / "rank-3.status.json").read_text())
        assert (status["rank"], status["exit_code"]) == (3, 0)

    def test_system_exit_with_a_code_exits_with_it_and_records(self, workdir):
        scripts, failures = workdir
        script = scripts / "three.py"
        script.write_text("raise SystemExit(3)\n")
        r = run_rank(script, env=rank_env(failures))
        assert r.returncode == 3
        (f,) = read_failures(str(failures))
        assert (f.rank, f.exc_type, f.message) == (3, "SystemExit", "3")

    def test_system_exit_with_a_message(self, workdir):
        scripts, failures = workdir
        script = scripts / "msg.py"
        script.write_text("import sys\nsys.exit('fatal: no data')\n")
        r = run_rank(script, env=rank_env(failures))
        assert r.returncode == 1
        assert "fatal: no data" in r.stderr
        (f,) = read_failures(str(failures))
        assert f.message == "fatal: no data"

    def test_without_a_failure_dir_it_still_fails_cleanly(self, workdir):
        scripts, failures = workdir
        script = scripts / "fail.py"
        script.write_text("raise ValueError('boom')\n")
        env = rank_env(failures)
        del env[bootstrap.WORK_DIR_ENV]
        r = run_rank(script, env=env)
        assert r.returncode == 1
        assert r.stderr.rstrip().endswith("ValueError: boom")
        assert os.listdir(failures) == []

    def test_missing_rank_env_is_minus_one(self, workdir):
        scripts, failures = workdir
        script = scripts / "fail.py"
        script.write_text("raise ValueError('boom')\n")
        env = rank_env(failures)
        for k in ("RANK", "LOCAL_RANK", bootstrap.NODE_INDEX_ENV):
            del env[k]
        env["RANK"] = "not-a-number"
        r = run_rank(script, env=env)
        assert r.returncode == 1
        (f,) = read_failures(str(failures))
        assert (f.rank, f.local_rank, f.node_index) == (-1, -1, -1)

    def test_torchelastic_error_file_is_written(self, workdir, tmp_path):
        # torchrun's own failure summary reads this file.
        pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
        scripts, failures = workdir
        script = scripts / "fail.py"
        script.write_text("raise ValueError('elastic boom')\n")
        error_file = tmp_path / "error.json"
        r = run_rank(script, env=rank_env(failures, TORCHELASTIC_ERROR_FILE=str(error_file)))
        assert r.returncode == 1
        data = json.loads(error_file.read_text())
        assert "elastic boom" in json.dumps(data)
        assert len(read_failures(str(failures))) == 1


def test_torchs_error_file_is_whole_or_absent(tmp_path, monkeypatch):
    """torch's agent parses it as soon as the rank ends: a rank stopped between its
    open and its write (the agent's SIGTERM to an echo) left it empty, and the agent
    crashed on it with its own traceback on the user's screen."""
    handler = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors.error_handler")
    target = tmp_path / "error.json"

    def cut(data, fp):
        fp.write('{"mess')
        raise RuntimeError("stopped in the middle of the write")

    monkeypatch.setattr(handler, "json", types.SimpleNamespace(dump=cut))
    bootstrap.torch_error_file(str(target), ValueError("boom"))
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    bootstrap.torch_error_file(str(target), ValueError("boom"))
    assert json.loads(target.read_text())["message"]["message"] == "ValueError: boom"
    assert os.listdir(tmp_path) == ["error.json"]


class TestUserTraceback:
    def test_drops_frames_before_the_script(self, tmp_path):
        script = tmp_path / "user.py"
        script.write_text("def f():\n    raise ValueError('inner')\n")
        ns = {}
        exec(compile(script.read_text(), str(script), "exec"), ns)
        try:
            ns["f"]()
        except ValueError as e:
            text = bootstrap.user_traceback(e, str(script))
        assert first_frame(text) == (str(script), 2, "f")
        assert __file__ not in text
        assert text.rstrip().endswith("ValueError: inner")

    def test_falls_back_to_the_full_traceback(self, tmp_path):
        try:
            raise ValueError("elsewhere")
        except ValueError as e:
            text = bootstrap.user_traceback(e, str(tmp_path / "not_involved.py"))
        assert first_frame(text)[0] == __file__
        assert "ValueError: elsewhere" in text


class TestLabels:
    """With labels on (the default), every line carries its global rank."""

    def test_every_line_labelled_and_whole(self, workdir):
        scripts, failures = workdir
        script = scripts / "many.py"
        script.write_text(
            "import sys\n"
            "for i in range(3000):\n"
            "    print('out', i)\n"
            "    sys.stderr.write('err %d\\n' % i)\n"
            "sys.stdout.write('no newline at the end')\n"
        )
        r = run_rank(script, env=rank_env(failures, **{bootstrap.LABELS_ENV: "1"}))
        assert r.returncode == 0
        out = r.stdout.splitlines()
        assert out[:3000] == ["[rank3]: out %d" % i for i in range(3000)]
        assert out[3000:] == ["[rank3]: no newline at the end"]
        assert r.stderr.splitlines() == ["[rank3]: err %d" % i for i in range(3000)]

    def test_last_words_of_a_crashing_rank_arrive(self, workdir):
        scripts, failures = workdir
        script = scripts / "crash.py"
        script.write_text(
            "import os, sys\n"
            "sys.stdout.write('partial line before death')\n"
            "sys.stdout.flush()\n"
            "os.kill(os.getpid(), 9)\n"
        )
        r = run_rank(script, env=rank_env(failures, **{bootstrap.LABELS_ENV: "1"}))
        assert r.returncode == -9
        assert r.stdout == "[rank3]: partial line before death\n"

    def test_per_rank_log_files(self, workdir, tmp_path):
        scripts, failures = workdir
        logs = tmp_path / "logs"
        logs.mkdir()
        script = scripts / "log.py"
        script.write_text("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n")
        env = rank_env(failures, **{bootstrap.LABELS_ENV: "1", bootstrap.LOG_DIR_ENV: str(logs)})
        r = run_rank(script, env=env)
        assert r.returncode == 0
        assert (logs / "rank-3.stdout.log").read_text() == "hello\n"
        assert (logs / "rank-3.stderr.log").read_text() == "oops\n"
