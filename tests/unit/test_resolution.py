"""plan.py: pure helpers: nproc, entrypoint and option resolution."""

from __future__ import annotations

import os

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.launch import plan as runner
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import (
    NPROC_KEYWORDS,
    StepDefaults,
    check_options,
    known_torchrun_options,
    merged_options,
    resolve_entrypoint,
    resolve_nproc,
    validate_nproc,
)


# --------------------------------------------------------------------------- validate_nproc


class TestValidateNproc:
    @pytest.mark.parametrize(
        "value, expected", [(1, 1), (8, 8), ("2", 2), (" 3 ", 3), ("16", 16)]
    )
    def test_positive_counts(self, value, expected):
        out = validate_nproc(value, "src")
        assert out == expected and type(out) is int

    @pytest.mark.parametrize("keyword", ["auto", "gpu", "cpu", "xpu", " auto "])
    def test_keywords_pass(self, keyword):
        assert validate_nproc(keyword, "src") == keyword.strip()

    def test_keywords_are_torchruns(self):
        assert {"auto", "gpu", "cpu"} <= set(NPROC_KEYWORDS)

    @pytest.mark.parametrize(
        "value",
        [0, -1, -8, True, False, 1.5, 2.0, "x", "", "0", "-2", "1.5", "AUTO", None, [2], {"n": 2}],
    )
    def test_invalid_raises_naming_value_and_source(self, value):
        with pytest.raises(TorchrunInvalidArgument) as e:
            validate_nproc(value, "the_source")
        msg = str(e.value)
        # a numeric string is reported as the number it was read as
        assert repr(value) in msg or (isinstance(value, str) and "=%s:" % value in msg)
        assert "the_source" in msg


# --------------------------------------------------------------------------- resolve_nproc

FULL = StepDefaults(nproc_per_node=4, derived_nproc=8)


class TestResolveNproc:
    @pytest.mark.parametrize(
        "call, options, defaults, expected",
        [
            # every level set: the call argument wins
            (3, {"nproc-per-node": "2"}, FULL, 3),
            # no call argument: torchrun_args
            (None, {"nproc-per-node": "2"}, FULL, 2),
            # no torchrun_args: @torchrun(nproc_per_node)
            (None, {}, FULL, 4),
            (None, {"max-restarts": "1"}, FULL, 4),
            # no decorator value: derived from resources
            (None, {}, StepDefaults(derived_nproc=8), 8),
            # nothing at all: one process
            (None, {}, StepDefaults(), 1),
            # a removed option (False/None) does not count as set
            (None, {"nproc-per-node": False}, FULL, 4),
            (None, {"nproc-per-node": None}, FULL, 4),
            # keywords at each level
            ("gpu", {"nproc-per-node": "2"}, FULL, "gpu"),
            (None, {"nproc-per-node": "auto"}, FULL, "auto"),
            (None, {}, StepDefaults(nproc_per_node="cpu", derived_nproc=8), "cpu"),
            # strings are validated into ints
            ("5", {}, StepDefaults(), 5),
            (None, {}, StepDefaults(nproc_per_node="6"), 6),
        ],
    )
    def test_precedence(self, call, options, defaults, expected):
        assert resolve_nproc(call, options, defaults) == expected

    def test_zero_in_the_call_is_an_error_not_unset(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            resolve_nproc(0, {}, FULL)
        assert "0" in str(e.value)

    @pytest.mark.parametrize(
        "call, options, defaults, source",
        [
            ("x", {}, FULL, "nproc_per_node"),
            (None, {"nproc-per-node": "two"}, FULL, "torchrun_args"),
            (None, {"nproc-per-node": True}, FULL, "torchrun_args"),
            (None, {"nproc-per-node": ["2", "4"]}, FULL, "torchrun_args"),
            (None, {}, StepDefaults(nproc_per_node=-1, derived_nproc=8), "@torchrun"),
            (None, {}, StepDefaults(derived_nproc=0), "resources"),
        ],
    )
    def test_invalid_value_at_each_level_names_its_source(self, call, options, defaults, source):
        with pytest.raises(TorchrunInvalidArgument) as e:
            resolve_nproc(call, options, defaults)
        assert source in str(e.value)

    def test_from_parsed_torchrun_args(self):
        # the spelling users write, through parse_options
        for spelling in (["--nproc_per_node", "3"], ["--nproc-per-node=3"], {"nproc_per_node": 3}):
            opts = merged_options(StepDefaults(), spelling)
            assert resolve_nproc(None, opts, FULL) == 3


# --------------------------------------------------------------------------- resolve_entrypoint


class TestResolveEntrypoint:
    def test_absolute(self, tmp_path):
        script = tmp_path / "train.py"
        script.write_text("pass\n")
        assert resolve_entrypoint(str(script), []) == str(script)
        assert resolve_entrypoint(str(script), ["/nonexistent"]) == str(script)

    def test_pathlike(self, tmp_path):
        script = tmp_path / "train.py"
        script.write_text("pass\n")
        assert resolve_entrypoint(script, []) == str(script)

    def test_relative_found_in_second_dir(self, tmp_path):
        first, second = tmp_path / "cwd", tmp_path / "flowdir"
        first.mkdir()
        (second / "sub").mkdir(parents=True)
        (second / "sub" / "train.py").write_text("pass\n")
        out = resolve_entrypoint("sub/train.py", [str(first), str(second)])
        assert out == str(second / "sub" / "train.py")
        assert os.path.isabs(out)

    def test_first_dir_wins(self, tmp_path):
        first, second = tmp_path / "a", tmp_path / "b"
        for d in (first, second):
            d.mkdir()
            (d / "train.py").write_text("pass\n")
        assert resolve_entrypoint("train.py", [str(first), str(second)]) == str(first / "train.py")

    def test_a_directory_is_not_a_script(self, tmp_path):
        first, second = tmp_path / "a", tmp_path / "b"
        (first / "train.py").mkdir(parents=True)
        second.mkdir()
        (second / "train.py").write_text("pass\n")
        assert resolve_entrypoint("train.py", [str(first), str(second)]) == str(second / "train.py")

    def test_result_is_normalised(self, tmp_path):
        (tmp_path / "train.py").write_text("pass\n")
        (tmp_path / "x").mkdir()
        out = resolve_entrypoint("./x/../train.py", [str(tmp_path)])
        assert out == str(tmp_path / "train.py")

    def test_relative_to_cwd_search_dir(self, tmp_path, monkeypatch):
        (tmp_path / "t.py").write_text("pass\n")
        monkeypatch.chdir(tmp_path)
        assert resolve_entrypoint("t.py", [os.getcwd()]) == str(tmp_path / "t.py")

    def test_missing_names_the_path_and_where_it_looked(self, tmp_path):
        a, b = tmp_path / "dir_a", tmp_path / "dir_b"
        a.mkdir()
        b.mkdir()
        with pytest.raises(TorchrunInvalidArgument) as e:
            resolve_entrypoint("nope/train_missing.py", [str(a), str(b)])
        msg = str(e.value)
        assert "nope/train_missing.py" in msg
        assert "does not exist in %s or %s." % (a / "nope", b / "nope") in msg

    def test_missing_absolute(self, tmp_path):
        missing = str(tmp_path / "gone.py")
        with pytest.raises(TorchrunInvalidArgument) as e:
            resolve_entrypoint(missing, [str(tmp_path)])
        assert missing in str(e.value)

    def test_relative_with_no_search_dirs_is_missing(self, tmp_path, monkeypatch):
        (tmp_path / "t.py").write_text("pass\n")
        monkeypatch.chdir(tmp_path)
        with pytest.raises(TorchrunInvalidArgument):
            resolve_entrypoint("t.py", [])

    @pytest.mark.parametrize("bad", [None, 123, ["train.py"], b"train.py", ""])
    def test_non_string_or_empty_raises_naming_it(self, bad):
        with pytest.raises(TorchrunInvalidArgument) as e:
            resolve_entrypoint(bad, ["/"])
        assert repr(bad) in str(e.value)

    def test_empty_pathlike_raises(self):
        class Empty(os.PathLike):
            def __fspath__(self):
                return ""

        with pytest.raises(TorchrunInvalidArgument):
            resolve_entrypoint(Empty(), ["/"])


# --------------------------------------------------------------------------- options


@pytest.mark.skipif(
    known_torchrun_options() is None,
    reason="torch is not installed: torchrun's options are read from torch's files",
)
class TestCheckOptions:
    def test_known_options_come_from_torchrun(self):
        known = known_torchrun_options()
        assert known is not None, "torch is installed in the test venv"
        assert {
            "nnodes",
            "nproc-per-node",
            "rdzv-backend",
            "rdzv-endpoint",
            "rdzv-id",
            "rdzv-conf",
            "max-restarts",
            "monitor-interval",
            "standalone",
        } <= known
        assert not any("_" in k for k in known)

    @pytest.mark.parametrize(
        "options",
        [
            {},
            {"max-restarts": "3"},
            {"monitor-interval": "1"},
            {"max-restarts": "3", "monitor-interval": "0.5", "standalone": True},
            {"rdzv-conf": None},
        ],
    )
    def test_accepts_real_options(self, options):
        check_options(options)

    def test_accepts_what_parse_options_produces_from_underscores(self):
        check_options(merged_options(StepDefaults(torchrun_args={"max_restarts": 1}), ["--monitor_interval", "2"]))

    def test_rejects_a_typo(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            check_options({"nproc-per-nod": "2", "max-restarts": "1"})
        msg = str(e.value)
        assert "--nproc-per-nod" in msg
        assert "--max-restarts" not in msg

    def test_rejects_all_unknown_named(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            check_options({"zzz-b": "1", "aaa-a": True, "nnodes": "2"})
        msg = str(e.value)
        assert "--aaa-a" in msg and "--zzz-b" in msg and "options" in msg

    def test_rejects_typo_given_in_list_form(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            check_options(merged_options(StepDefaults(), ["--max_restart", "2"]))
        assert "--max-restart" in str(e.value)

    def test_skipped_without_torch(self, monkeypatch):
        monkeypatch.setattr(runner, "known_torchrun_options", lambda: None)
        check_options({"definitely-not-an-option": "1"})


class TestMergedOptions:
    def test_call_overrides_decorator(self):
        defaults = StepDefaults(torchrun_args={"max_restarts": 1, "monitor_interval": 5})
        assert merged_options(defaults, ["--max-restarts", "3"]) == {
            "max-restarts": 3,
            "monitor-interval": "5",
        }

    def test_override_across_spellings(self):
        defaults = StepDefaults(torchrun_args=["--max_restarts=1"])
        assert merged_options(defaults, {"max-restarts": 2}) == {"max-restarts": 2}  # typed: torch reads it as an int

    def test_call_can_remove_a_decorator_option(self):
        defaults = StepDefaults(torchrun_args={"monitor_interval": 5})
        assert merged_options(defaults, {"monitor_interval": False}) == {"monitor-interval": False}

    def test_either_side_empty(self):
        assert merged_options(StepDefaults(), None) == {}
        assert merged_options(StepDefaults(torchrun_args={"virtual_local_rank": True}), None) == {
            "virtual-local-rank": True
        }
        assert merged_options(StepDefaults(), {"virtual_local_rank": True}) == {"virtual-local-rank": True}

    def test_decorator_args_not_mutated(self):
        deco = {"max_restarts": 1}
        merged_options(StepDefaults(torchrun_args=deco), {"max_restarts": 9})
        assert deco == {"max_restarts": 1}

    def test_bad_decorator_args_name_the_decorator(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            merged_options(StepDefaults(torchrun_args=["3"]), None)
        assert "@torchrun(torchrun_args)" in str(e.value)

    def test_bad_call_args_name_the_call(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            merged_options(StepDefaults(), "--standalone")
        msg = str(e.value)
        assert "torchrun_args" in msg and "@torchrun" not in msg
