"""Bad inputs get a clear TorchrunInvalidArgument before anything starts, and
leave nothing behind (issue 13, item 7)."""

from __future__ import annotations

import os
import py_compile
import threading
import zipfile

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.launch import command, inputs, plan
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import encode_args
from metaflow_extensions.torchrun.plugins.torchrun.launch.options import parse_options
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, plan_call
from metaflow_extensions.torchrun.plugins.torchrun.launch.prepare import rank_environment
from plans import node_facts, script_plan
from metaflow_extensions.torchrun.plugins.torchrun.procs import names


def refused(fn, *args, **kwargs) -> str:
    with pytest.raises(TorchrunInvalidArgument) as e:
        fn(*args, **kwargs)
    return str(e.value)


def module_level_function(x=None):
    return x


# -- str() that raises ----------------------------------------------------------------


class Unprintable(str):
    def __str__(self):
        raise RuntimeError("no str for you")


class BadInt(int):
    def __str__(self):
        raise ValueError("broken __str__")


class BytesPath(os.PathLike):
    def __fspath__(self):
        return b"/data/x"


class TestStrThatRaises:
    def test_list_item(self):
        msg = refused(encode_args, ["ok", Unprintable("x")])
        assert "entrypoint_args" in msg and "no str for you" in msg

    def test_dict_value_names_the_key(self):
        msg = refused(encode_args, {"epochs": BadInt(3)})
        assert "epochs" in msg and "broken __str__" in msg

    def test_torchrun_option_value(self):
        msg = refused(parse_options, {"max_restarts": BadInt(1)})
        assert "max_restarts" in msg

    def test_bytes_path_is_decoded_not_spelled_as_bytes(self):
        assert encode_args([BytesPath()]) == ["/data/x"]


# -- nproc_per_node -----------------------------------------------------------------


class TestNprocBound:
    @pytest.mark.parametrize("value", [1, 8, plan.MAX_NPROC_PER_NODE])
    def test_in_bounds(self, value):
        assert plan.validate_nproc(value, "nproc_per_node") == value

    @pytest.mark.parametrize("value", [plan.MAX_NPROC_PER_NODE + 1, 10**9, str(10**6)])
    def test_above_the_bound(self, value):
        msg = refused(plan.validate_nproc, value, "nproc_per_node")
        assert "at most %d" % plan.MAX_NPROC_PER_NODE in msg


# -- timeouts -------------------------------------------------------------------------


class TestTimeouts:
    def test_defaults_and_strings(self):
        assert inputs.validate_timeouts(30, 600) == (30.0, 600.0)
        assert inputs.validate_timeouts("2", "5") == (2.0, 5.0)

    @pytest.mark.parametrize("heartbeat", [0.01, 0, -1, 1.9])
    def test_heartbeat_below_the_minimum(self, heartbeat):
        msg = refused(inputs.validate_timeouts, heartbeat, 600)
        assert "heartbeat_timeout" in msg and "at least 2 seconds" in msg

    @pytest.mark.parametrize("start", [0.01, 4.9])
    def test_start_below_the_minimum(self, start):
        assert "start_timeout" in refused(inputs.validate_timeouts, 30, start)

    @pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "soon", None, [1]])
    def test_not_a_usable_number(self, value):
        assert "heartbeat_timeout" in refused(inputs.validate_timeouts, value, 600)

    def test_minimum_leaves_several_heartbeats_per_timeout(self):
        from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig

        config = GangConfig("g", 2, heartbeat_timeout=inputs.MIN_HEARTBEAT_TIMEOUT)
        assert config.heartbeat_timeout / config.heartbeat_interval >= 10


class TestStopOptions:
    @pytest.mark.parametrize("value", [None, 2, 2.5, "30"])
    def test_hang_timeout_off_or_seconds(self, value):
        assert inputs.validate_hang_timeout(value) == (None if value is None else float(value))

    @pytest.mark.parametrize("value, words", [
        (1, "at least 2 seconds"), (0, "at least 2 seconds"), (-5, "at least 2 seconds"),
        (True, "not a number"), ("soon", "not a number"), (float("inf"), "finite"), (float("nan"), "finite"),
    ])
    def test_hang_timeout_refused(self, value, words):
        with pytest.raises(TorchrunInvalidArgument) as e:
            inputs.validate_hang_timeout(value)
        assert "@torchrun(hang_timeout)" in str(e.value) and words in str(e.value)

    @pytest.mark.parametrize("value, timeout, expected", [
        (30, None, 30.0), (0, None, 0.0), (30, 10.0, 10.0), (5, 600.0, 5.0), ("12.5", None, 12.5),
    ])
    def test_shutdown_grace_is_capped_by_the_steps_timeout(self, value, timeout, expected):
        assert inputs.validate_shutdown_grace(value, timeout) == expected

    @pytest.mark.parametrize("value", [-1, None, "x", float("inf"), False])
    def test_shutdown_grace_refused(self, value):
        with pytest.raises(TorchrunInvalidArgument) as e:
            inputs.validate_shutdown_grace(value, None)
        assert "@torchrun(shutdown_grace)" in str(e.value)

    @pytest.mark.parametrize("specs, expected", [
        ([], None),
        ([("resources", {"cpu": 2})], None),
        ([("timeout", {"seconds": 20, "minutes": 0, "hours": 0})], 20.0),
        ([("timeout", {"seconds": 0, "minutes": 2, "hours": 1})], 3720.0),
        ([("timeout", {"seconds": "x"})], None),
        ([("timeout", {"seconds": 0, "minutes": 0, "hours": 0})], None),
    ])
    def test_step_timeout_from_the_decorators(self, specs, expected):
        assert inputs.step_timeout(specs) == expected

    def test_the_agent_gets_the_grace_in_whole_seconds(self):
        env = rank_environment({}, StepDefaults(shutdown_grace=2.5), script_plan(), node_facts())
        assert env[names.SHUTDOWN_TIMEOUT_ENV] == "3"

    @pytest.mark.parametrize("options, expected", [
        ({}, False), ({"max-restarts": "0"}, False), ({"max-restarts": 0}, False), ({"max-restarts": " 0 "}, False),
        ({"max-restarts": False}, False), ({"max-restarts": "2"}, True), ({"max-restarts": 1}, True),
        ({"max-restarts": "two"}, False), ({"max-restarts": True}, False),  # plan_call refuses both: never c10d for them
    ])
    def test_restarts_allowed(self, options, expected):
        assert plan.restarts_allowed(options) is expected

    @pytest.mark.parametrize("restarts, base, expected", [
        (True, {}, "1"),  # a restarted round must not read the last round's addresses
        (False, {}, None),  # torch's default: the ranks use the agent's store, 0.5 s sooner
        (False, {names.SHARE_STORE_OFF_ENV: "1"}, "1"),  # the user's setting stays
        (True, {names.SHARE_STORE_OFF_ENV: "0"}, "0"),
    ])
    def test_the_ranks_own_store_only_where_torchrun_may_restart_them(self, restarts, base, expected):
        options = {"max-restarts": 1} if restarts else {}
        env = rank_environment(base, StepDefaults(), script_plan(options), node_facts())
        assert env.get(names.SHARE_STORE_OFF_ENV) == expected


# -- the entrypoint -------------------------------------------------------------------


def plan_script(path, search_dirs, args=None):
    return plan_call(path, args, 1, None, StepDefaults(), search_dirs)


class TestEntrypoint:
    def test_a_directory_is_named_as_one(self, tmp_path):
        (tmp_path / "pkg").mkdir()
        msg = refused(plan_script, "pkg", [str(tmp_path)])
        assert "is a directory" in msg and "does not exist" not in msg

    def test_a_directory_with_main_gets_a_hint(self, tmp_path):
        (tmp_path / "app").mkdir()
        (tmp_path / "app" / "__main__.py").write_text("print(1)\n")
        assert "app/__main__.py" in refused(plan_script, "app", [str(tmp_path)])

    def test_missing_still_says_so(self, tmp_path):
        assert "does not exist" in refused(plan_script, "nope.py", [str(tmp_path)])

    def test_shell_script_is_refused_naming_file_and_line(self, tmp_path):
        (tmp_path / "run.sh").write_text("#!/bin/sh\nset -e\necho hello world\n")
        msg = refused(plan_script, "run.sh", [str(tmp_path)])
        assert "run.sh" in msg and "not valid Python" in msg and "line 3" in msg
        assert "echo hello world" in msg

    def test_binary_file_is_refused(self, tmp_path):
        (tmp_path / "model.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 10)
        assert "binary file" in refused(plan_script, "model.bin", [str(tmp_path)])

    def test_syntax_error_in_a_python_script_is_caught_before_the_start(self, tmp_path):
        (tmp_path / "train.py").write_text("import os\n\ndef main(:\n    pass\n")
        msg = refused(plan_script, "train.py", [str(tmp_path)])
        assert "line 3" in msg and "train.py" in msg

    def test_valid_script_with_a_coding_cookie_and_warnings(self, tmp_path):
        script = tmp_path / "train.py"
        script.write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9'\npath = '\\d'\n")
        assert plan_script("train.py", [str(tmp_path)]).script == str(script)

    def test_compiled_and_zipped_python_run_too(self, tmp_path):
        src = tmp_path / "prog.py"
        src.write_text("print('hi')\n")
        pyc = py_compile.compile(str(src), cfile=str(tmp_path / "prog.pyc"))
        assert plan_script(pyc, [str(tmp_path)]).script == pyc
        app = tmp_path / "app.pyz"
        with zipfile.ZipFile(app, "w") as z:
            z.writestr("__main__.py", "print('hi')\n")
        assert plan_script(str(app), [str(tmp_path)]).script == str(app)

    def test_unreadable_script(self, tmp_path, monkeypatch):
        (tmp_path / "train.py").write_text("x = 1\n")

        def deny(*a, **k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(inputs, "open", deny, raising=False)
        assert "cannot be read" in refused(plan_script, "train.py", [str(tmp_path)])


# -- arguments --------------------------------------------------------------------------


class TestArguments:
    def test_nul_in_a_script_argument(self, tmp_path):
        (tmp_path / "t.py").write_text("")
        msg = refused(plan_script, "t.py", [str(tmp_path)], ["ok", "a\0b"])
        assert "NUL" in msg and "item 1" in msg

    def test_a_million_arguments_are_fine(self, tmp_path):
        """They travel in the entry file, not on torchrun's command line."""
        (tmp_path / "t.py").write_text("")
        argv = [str(i) for i in range(1_000_000)]
        assert len(plan_script("t.py", [str(tmp_path)], argv).entry_argv) == 1_000_000

    def test_torchrun_options_too_big_for_exec(self, tmp_path):
        (tmp_path / "t.py").write_text("")
        huge = {"rdzv_conf": "x=" + "y" * (command.MAX_ARG_STRLEN + 10)}
        msg = refused(plan_call, "t.py", None, 1, huge, StepDefaults(), [str(tmp_path)])
        assert "torchrun_args" in msg

    def test_command_and_environment_over_arg_max(self, monkeypatch):
        monkeypatch.setattr(command, "arg_max", lambda: 200_000)
        options = {"role-%d" % i: "v" * 1000 for i in range(200)}
        assert "more than this system accepts" in refused(command.check_command_size, options, {})
        command.check_command_size({"max-restarts": "3"}, {"HOME": "/root"})

    def test_nul_in_a_torchrun_option(self):
        assert "NUL" in refused(command.check_command_size, {"role": "a\0b"}, {})


class TestFunctionArguments:
    def test_unpicklable_arguments_are_refused_in_the_plan(self):
        msg = refused(plan_call, module_level_function, {"x": threading.Lock()}, 1, None,
                      StepDefaults(), [])
        assert "cannot be pickled" in msg and "lock" in msg

    def test_a_lambda_argument(self):
        assert "cannot be pickled" in refused(
            plan_call, module_level_function, [lambda: 1], 1, None, StepDefaults(), [])

    def test_picklable_arguments_plan(self):
        p = plan_call(module_level_function, {"x": [1, "a", None]}, 1, None, StepDefaults(), [])
        assert p.function is not None


class TestNothingLeftBehind:
    def test_record_removes_the_work_dir_even_when_recording_fails(self, tmp_path):
        from types import SimpleNamespace

        from metaflow_extensions.torchrun.plugins.torchrun.runtime.call import CallRun
        from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_result import CallEnd
        from metaflow_extensions.torchrun.plugins.torchrun.host.logs import LogKey
        from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import CallFiles

        files = CallFiles(LogKey("Flow-1", "train-2-0", "c0"), 0, str(tmp_path))
        session = SimpleNamespace(client=SimpleNamespace(), context=SimpleNamespace(  # no topology: recording fails
            route=("", None), host_base=str(tmp_path),
            defaults=SimpleNamespace(snapshot_every=None, snapshot_memory=None, restarts=0)))
        run = CallRun(session=session, plan=None, index=0)  # type: ignore[arg-type]
        run.launch.files, run.launch.workdir = files, files.work_dir
        assert os.path.exists(files.work_dir)
        with pytest.raises(AttributeError):
            run.result(CallEnd())
        assert not os.path.exists(files.work_dir)


def test_an_environment_variable_too_big_for_exec():
    msg = refused(command.check_command_size, {}, {"BIG": "x" * (command.MAX_ARG_STRLEN + 1)})
    assert "BIG" in msg
