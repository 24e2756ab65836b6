"""command.py: user arguments -> argv, and the torchrun command line."""

from __future__ import annotations

import argparse
import pathlib
import random
import string

import pytest
from metaflow.exception import MetaflowException

from metaflow_extensions.torchrun.plugins.torchrun.launch.command import (
    AGENT_MODULE,
    BOOTSTRAP_MODULE,
    Launch,
    argparse_hint,
    build_command,
    default_options,
    encode_args,
    format_endpoint,
    keys_given,
    options_to_argv,
)
from metaflow_extensions.torchrun.plugins.torchrun.launch import torch_checks
from metaflow_extensions.torchrun.plugins.torchrun.launch.options import OptionSpec, canonical_option, parse_options
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument

# Strings a shell would mangle; each must reach the script as one argv item, unchanged.
NASTY = [
    "two words",
    "  leading and trailing  ",
    "",
    "'single'",
    '"double"',
    "it's",
    "$(rm -rf /)",
    "`id`",
    "$HOME",
    "${PATH}",
    "a;b && c | d > e",
    "line1\nline2",
    "tab\there",
    "back\\slash",
    "*.py",
    "~",
    "ünïcödé ✓ 日本語",
    "emoji 🚀",
    "--looks-like-a-flag",
    "-5",
    "=",
    "a=b=c",
    "%s %d %%",
]


class BadRepr:
    def __repr__(self):
        return "<BadThing-1234>"


# --------------------------------------------------------------------------- encode_args


class TestEncodeArgsBasics:
    def test_none_is_empty(self):
        assert encode_args(None) == []

    @pytest.mark.parametrize("empty", [[], (), {}])
    def test_empty_containers(self, empty):
        assert encode_args(empty) == []

    def test_list_items_pass_through_as_str(self):
        assert encode_args(["a", 1, 2.5, -3, pathlib.Path("/data/x.csv")]) == [
            "a",
            "1",
            "2.5",
            "-3",
            "/data/x.csv",
        ]

    def test_tuple_like_list(self):
        assert encode_args(("--lr", 0.1, "x")) == ["--lr", "0.1", "x"]

    def test_bool_in_a_list_is_spelled_as_python_spells_it(self):
        assert encode_args([True, False]) == ["True", "False"]

    def test_list_order_and_duplicates_kept(self):
        assert encode_args(["b", "a", "b"]) == ["b", "a", "b"]

    def test_returns_a_new_list_of_str(self):
        given = ["a", "b"]
        out = encode_args(given)
        assert out == given and out is not given
        assert all(type(x) is str for x in encode_args([1, 2.0, "s", pathlib.Path("p")]))


class TestEncodeArgsDict:
    def test_key_value(self):
        assert encode_args({"k": "v"}) == ["--k", "v"]

    def test_numbers(self):
        assert encode_args({"epochs": 3, "lr": 0.5}) == ["--epochs", "3", "--lr", "0.5"]

    @pytest.mark.parametrize("falsy", [0, 0.0, ""])
    def test_falsy_values_that_are_not_false_or_none_are_kept(self, falsy):
        assert encode_args({"k": falsy}) == ["--k", str(falsy)]

    def test_true_is_a_bare_flag(self):
        assert encode_args({"verbose": True}) == ["--verbose"]

    def test_false_omits_the_option(self):
        assert encode_args({"a": 1, "k": False, "b": 2}) == ["--a", "1", "--b", "2"]

    def test_none_is_a_bare_flag_as_in_0_2(self):
        # Public 0.2 code relies on it ("value None tells current.torch.run to
        # use store_true style"); True is a bare flag too, so nothing is lost.
        assert encode_args({"a": 1, "resume_ckpt": None}) == ["--a", "1", "--resume_ckpt"]
        assert keys_given({"a": 1, "resume_ckpt": None, "x": None}, None) == ["resume_ckpt", "x"]

    def test_every_bad_key_is_named_in_one_message(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            encode_args({"a": object(), "": 1, "b": [1, object()]})
        msg = str(e.value)
        assert "3 problems" in msg and "entrypoint_args['a']" in msg and "entrypoint_args['b']" in msg, msg


class TestLegacyEncoding:
    """@torchrun(args_as="0.2"): 0.2's json.dumps(value) without its quotes."""

    @pytest.mark.parametrize(
        "value, token",
        [(True, "true"), (False, "false"), ([1, 2], "[1, 2]"), (0.5, "0.5"), ("a b", "a b"),
         ('say "hi"', "say \\hi\\"), ({"x": 1}, "{x: 1}"), (3, "3")],
    )
    def test_values_as_0_2_spelled_them(self, value, token):
        assert encode_args({"k": value}, style="0.2") == ["--k", token]

    @pytest.mark.parametrize("value", [None, ""])
    def test_none_and_empty_are_bare_flags(self, value):
        assert encode_args({"k": value}, style="0.2") == ["--k"]

    def test_a_list_is_argv_unchanged(self):
        assert encode_args(["--x", True], style="0.2") == ["--x", "True"]

    def test_what_json_cannot_spell_is_named(self):
        with pytest.raises(TorchrunInvalidArgument, match="as 0.2 did"):
            encode_args({"k": object()}, style="0.2")


class TestArgparseHint:
    TEXT = "usage: train.py [-h] [--bf16 BF16]\ntrain.py: error: argument --bf16: expected one argument"

    def test_names_what_0_2_passed(self):
        hint = argparse_hint(self.TEXT, ["lr", "bf16"])
        assert "0.2 passed `--bf16 true`" in hint and "'bf16': 'true'" in hint and 'args_as="0.2"' in hint

    def test_aliases_in_argparse_message(self):
        assert argparse_hint("error: argument -b/--bf16: expected one argument", ["bf16"])

    def test_none_for_another_key_or_error(self):
        assert argparse_hint(self.TEXT, ["fp16"]) is None
        assert argparse_hint("error: argument --bf16: invalid int value", ["bf16"]) is None

    @pytest.mark.parametrize("seq", [["a", "b"], ("a", "b")])
    def test_list_or_tuple_value_is_one_flag_then_values(self, seq):
        assert encode_args({"k": seq}) == ["--k", "a", "b"]

    def test_list_value_items_are_str(self):
        assert encode_args({"sizes": [1, 2.5]}) == ["--sizes", "1", "2.5"]

    @pytest.mark.parametrize("key", ["k", "-k", "--k", "---k"])
    def test_leading_dashes_in_keys_are_normalised(self, key):
        assert encode_args({key: "v"}) == ["--k", "v"]

    def test_underscores_in_keys_are_kept_for_the_users_parser(self):
        # entrypoint args go to the user's own argparse: never rewrite their names
        assert encode_args({"learning_rate": 0.1}) == ["--learning_rate", "0.1"]

    def test_insertion_order_is_kept(self):
        args = {"z": 1, "a": True, "m": [1, 2], "b": False, "c": "x"}
        assert encode_args(args) == ["--z", "1", "--a", "--m", "1", "2", "--c", "x"]

    def test_dict_is_not_mutated(self):
        args = {"-k": [1, 2], "f": False}
        encode_args(args)
        assert args == {"-k": [1, 2], "f": False}


class TestEncodeArgsVerbatim:
    @pytest.mark.parametrize("value", NASTY)
    def test_list_item_is_one_verbatim_argv_item(self, value):
        assert encode_args(["before", value, "after"]) == ["before", value, "after"]

    @pytest.mark.parametrize("value", NASTY)
    def test_dict_value_is_one_verbatim_argv_item(self, value):
        assert encode_args({"k": value}) == ["--k", value]

    @pytest.mark.parametrize("value", NASTY)
    def test_dict_list_value_items_are_verbatim(self, value):
        assert encode_args({"k": [value, value]}) == ["--k", value, value]

    def test_random_lists_round_trip(self):
        rng = random.Random(1234)
        alphabet = string.printable + "ü日🚀\x7f"
        for _ in range(200):
            items = [
                "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
                for _ in range(rng.randint(0, 8))
            ]
            assert encode_args(items) == items

    def test_random_dicts_parse_back_with_argparse(self):
        # What a user's script does with the argv: argparse must get every value
        # back exactly, whatever characters it holds.
        rng = random.Random(99)
        alphabet = string.ascii_letters + string.digits + " '\"$`()\n\t;|&*?ü日🚀=\\"
        for _ in range(100):
            args = {}
            for i in range(rng.randint(1, 6)):
                value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))
                args["opt_%d" % i] = value
            parser = argparse.ArgumentParser()
            for key in args:
                parser.add_argument("--" + key)
            parsed = vars(parser.parse_args(encode_args(args)))
            assert parsed == args


class TestEncodeArgsInvalid:
    @pytest.mark.parametrize(
        "args, shown",
        [
            ({1, 2}, "{1, 2}"),
            (frozenset({"x"}), "frozenset({'x'})"),
            ("--lr 0.1", "'--lr 0.1'"),
            (b"--lr", "b'--lr'"),
            (42, "42"),
            (BadRepr(), "<BadThing-1234>"),
            (iter(["a"]), "iterator"),
        ],
    )
    def test_whole_args_of_a_wrong_type(self, args, shown):
        with pytest.raises(TorchrunInvalidArgument) as e:
            encode_args(args)
        assert shown in str(e.value)

    @pytest.mark.parametrize(
        "item, shown",
        [
            (None, "None"),
            ({"a": 1}, "{'a': 1}"),
            (["nested"], "['nested']"),
            ({3}, "{3}"),
            (b"bytes", "b'bytes'"),
            (BadRepr(), "<BadThing-1234>"),
            (object, "<class 'object'>"),
        ],
    )
    def test_bad_list_item(self, item, shown):
        with pytest.raises(TorchrunInvalidArgument) as e:
            encode_args(["ok", item])
        assert shown in str(e.value)

    @pytest.mark.parametrize(
        "value, shown",
        [
            ({"x": 1}, "{'x': 1}"),
            ({1, 2}, "{1, 2}"),
            (BadRepr(), "<BadThing-1234>"),
            (b"raw", "b'raw'"),
            (["ok", None], "None"),
            (["ok", {"deep": 1}], "{'deep': 1}"),
            ((["nested"],), "['nested']"),
        ],
    )
    def test_bad_dict_value(self, value, shown):
        with pytest.raises(TorchrunInvalidArgument) as e:
            encode_args({"opt": value})
        msg = str(e.value)
        assert shown in msg
        assert "opt" in msg  # the option it was given for

    @pytest.mark.parametrize("key", [1, None, "", "-", "--", ("a",)])
    def test_bad_dict_key(self, key):
        with pytest.raises(TorchrunInvalidArgument) as e:
            encode_args({key: "v"})
        assert repr(key) in str(e.value)

    def test_message_names_the_argument(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            encode_args({1, 2}, "my_special_args")
        assert "my_special_args" in str(e.value)

    def test_error_is_a_metaflow_exception(self):
        with pytest.raises(MetaflowException):
            encode_args("a string")


# --------------------------------------------------------------------------- parse_options


class TestParseOptions:
    def test_none(self):
        assert parse_options(None) == {}

    @pytest.mark.parametrize(
        "spelling",
        [
            {"max_restarts": 3},
            {"max-restarts": 3},
            {"--max_restarts": 3},
            {"--max-restarts": "3"},
            ["--max_restarts", "3"],
            ["--max-restarts", "3"],
            ["--max-restarts", 3],
            ["--max-restarts=3"],
            ["--max_restarts=3"],
            ("--max-restarts", "3"),
        ],
    )
    def test_every_spelling_gives_the_same_key_and_value(self, spelling):
        assert parse_options(spelling) == {"max-restarts": "3"}

    def test_canonical_option(self):
        assert canonical_option("--nproc_per_node") == "nproc-per-node"
        assert canonical_option(" max_restarts ") == "max-restarts"
        assert canonical_option("rdzv-conf") == "rdzv-conf"

    def test_dict_values_become_strings(self):
        assert parse_options({"a": 1, "b": 2.5, "c": "x"}) == {"a": "1", "b": "2.5", "c": "x"}

    def test_dict_true_false_are_kept_as_markers(self):
        assert parse_options({"virtual_local_rank": True, "rdzv_conf": False}) == {
            "virtual-local-rank": True,
            "rdzv-conf": False,
        }

    def test_dict_none_is_a_bare_flag_as_in_0_2(self):
        assert parse_options({"max_restarts": None}) == {"max-restarts": True}

    def test_dict_empty_is_refused(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options({"max_restarts": ""})
        assert "torchrun_args['max_restarts'] is ''" in str(e.value)
        assert "True for a bare --max_restarts" in str(e.value)

    def test_dict_list_value_of_one_item(self):
        assert parse_options({"k": [1]}) == {"k": "1"}

    def test_dict_list_of_several_values_is_refused(self):
        # torchrun's options take one value: the others would be the script.
        with pytest.raises(TorchrunInvalidArgument, match="2 values"):
            parse_options({"k": [1, "b"]})

    def test_an_owned_option_is_named_before_its_empty_value(self):
        # {"no_python": ""} was told to write True, which was then refused as owned.
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options({"no_python": ""})
        assert "--no-python is set by @torchrun" in str(e.value) and "is ''" not in str(e.value)

    def test_every_problem_in_one_message(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options({"no_python": "", "nnodes": 2, "a": "", "b": object()})
        msg = str(e.value)
        assert "4 problems" in msg and "--no-python" in msg and "--nnodes" in msg, msg
        assert "['a'] is ''" in msg and "['b']" in msg, msg

    def test_allowed_owned_names_pass_through_for_the_caller(self):
        assert parse_options({"master_port": 41000}, allow=("master-port",)) == {"master-port": "41000"}
        assert parse_options(["--master-port", "41000"], allow=("master-port",)) == {"master-port": "41000"}

    def test_bare_flags_in_a_list(self):
        assert parse_options(["--virtual-local-rank"]) == {"virtual-local-rank": True}
        assert parse_options(["--virtual-local-rank", "--role", "w", "--tee", "3"]) == {
            "virtual-local-rank": True,
            "role": "w",
            "tee": "3",
        }
        assert parse_options(["--role", "w", "--virtual-local-rank"]) == {
            "role": "w",
            "virtual-local-rank": True,
        }

    @pytest.mark.parametrize("tokens", [["--k", "a", "b"], ["--k", "a", "b", "c", "--x"], ["--k=a", "b"]])
    def test_several_values_for_one_option_are_refused(self, tokens):
        with pytest.raises(TorchrunInvalidArgument):
            parse_options(tokens)

    @pytest.mark.parametrize("number", ["-1", "-1.5", "-1e3", "-0", "-.5"])
    def test_negative_numbers_are_values(self, number):
        assert parse_options(["--max-restarts", number]) == {"max-restarts": number}

    def test_negative_number_after_equals(self):
        assert parse_options(["--x=-2"]) == {"x": "-2"}

    def test_equals_form_keeps_later_equals_in_the_value(self):
        assert parse_options(["--rdzv_conf=join_timeout=900,is_host=1"]) == {
            "rdzv-conf": "join_timeout=900,is_host=1"
        }
        assert parse_options(["--log-dir="]) == {"log-dir": ""}

    def test_values_are_verbatim(self):
        for value in ["a b", "$(x)", "`y`", "ü", "line\nbreak"]:
            assert parse_options(["--k", value]) == {"k": value}

    @pytest.mark.parametrize(
        "tokens, shown",
        [
            (["3"], "'3'"),
            (["-1"], "'-1'"),
            (["orphan", "--k", "v"], "'orphan'"),
            (["--k=v", "stray"], "'stray'"),
        ],
    )
    def test_value_with_no_option_name_raises(self, tokens, shown):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options(tokens)
        assert shown in str(e.value)

    @pytest.mark.parametrize("args", ["--standalone", {1, 2}, 5, b"--x"])
    def test_wrong_type_raises(self, args):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options(args)
        assert repr(args) in str(e.value)

    def test_bad_dict_value_raises_naming_it(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options({"rdzv_conf": {"timeout": 5}})
        assert "{'timeout': 5}" in str(e.value)

    def test_bad_dict_key_raises(self):
        with pytest.raises(TorchrunInvalidArgument):
            parse_options({"": 1})

    def test_the_what_label_is_in_the_message(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options(["3"], "@torchrun(torchrun_args)")
        assert "@torchrun(torchrun_args)" in str(e.value)


class TestMetaflowTorchrun02Forms:
    """Code written for metaflow-torchrun 0.2 runs, or is told why not."""

    @pytest.mark.parametrize(
        "pairs, expected",
        [
            (["nproc_per_node", 1], {"nproc-per-node": "1"}),
            (["nproc_per_node", 2, "max_restarts", "3"], {"nproc-per-node": "2", "max-restarts": "3"}),
            (("max-restarts", 1), {"max-restarts": "1"}),
            (["virtual_local_rank", True, "tee", False], {"virtual-local-rank": True, "tee": False}),
            (["rdzv_conf", "join_timeout=900"], {"rdzv-conf": "join_timeout=900"}),
        ],
    )
    def test_name_value_pairs(self, pairs, expected):
        assert parse_options(pairs) == expected

    def test_pairs_and_argv_give_the_same_options(self):
        assert parse_options(["max_restarts", 2]) == parse_options(["--max-restarts", "2"])

    def test_odd_pairs_are_refused_naming_both_forms(self):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options(["nproc_per_node", 1, "max_restarts"])
        assert "pairs" in str(e.value) and "--name" in str(e.value)

    def test_pairs_none_is_a_bare_flag_and_empty_is_refused(self):
        assert parse_options(["standalone_x", None]) == {"standalone-x": True}
        with pytest.raises(TorchrunInvalidArgument, match="True for a bare"):
            parse_options(["max_restarts", ""])

    @pytest.mark.parametrize(
        "args, option, hint",
        [
            ({"master_port": "41000"}, "--master-port", "@torchrun(port=N)"),
            ({"master_addr": "10.0.0.1"}, "--master-addr", "current.parallel.main_ip"),
            (["--nnodes", "2"], "--nnodes", "num_parallel"),
            (["node_rank", 0], "--node-rank", "current.parallel.node_index"),
            ({"rdzv_backend": "static"}, "--rdzv-backend", "rdzv_conf"),
            ({"rdzv-endpoint": "h:1"}, "--rdzv-endpoint", "c10d rendezvous"),
            ({"rdzv_id": "1"}, "--rdzv-id", "c10d rendezvous"),
            ({"no_python": True}, "--no-python", "entrypoint="),
            ({"module": True}, "--module", "entrypoint="),
            (["--run_path"], "--run-path", "entrypoint="),
            ({"standalone": True}, "--standalone", "num_parallel=1"),
        ],
    )
    def test_owned_options_are_refused_with_the_torchrun_way(self, args, option, hint):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_options(args, "@torchrun(torchrun_args)")
        msg = str(e.value)
        assert "@torchrun(torchrun_args): %s is set by @torchrun" % option in msg
        assert hint in msg

    @pytest.mark.parametrize(
        "args",
        [{"print_completion": "bash"}, {"--print-completion": True}, ["--print-completion", "zsh"],
         ["--print-completion=bash"], ["print_completion", "bash"]],
    )
    def test_print_completion_is_refused_on_every_torch(self, args):
        # torch 2.14's --print-completion prints a shell script and exits before any
        # rank starts; 2.13 has no such option, and it is refused by name there too.
        for specs in (None, torch_checks.known_option_specs(),
                      {"print-completion": OptionSpec(takes_value=True)}):  # as torch 2.14 reads it
            with pytest.raises(TorchrunInvalidArgument) as e:
                parse_options(args, "torchrun_args", specs=specs)
            msg = str(e.value)
            assert "torchrun_args: --print-completion cannot be used under @torchrun" in msg, msg
            assert "without starting a rank" in msg and "unknown" not in msg

    def test_an_abbreviation_of_print_completion_is_refused(self):
        with pytest.raises(TorchrunInvalidArgument, match="abbreviation torchrun would read as --print-completion"):
            parse_options({"print": "bash"})

    def test_print_completion_is_refused_at_the_call_not_as_unknown(self):
        from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, plan_call

        with pytest.raises(TorchrunInvalidArgument) as e:
            plan_call("train.py", None, None, {"print_completion": "bash"}, StepDefaults(), [])
        assert "--print-completion cannot be used under @torchrun" in str(e.value)
        assert "unknown torchrun option" not in str(e.value)

    def test_no_python_empty_string_is_refused_before_torchrun_sees_it(self):
        # 0.2 made {"no_python": ""} a bare flag; here it used to crash torchrun.
        with pytest.raises(TorchrunInvalidArgument):
            parse_options({"no_python": ""})

    def test_every_owned_option_is_a_real_torchrun_option(self):
        from metaflow_extensions.torchrun.plugins.torchrun.launch import options, torch_checks

        # The pinned torch's own parser, read as require_torch reads it.
        run_py = torch_checks.find_torch().run_py
        assert run_py
        with open(run_py, encoding="utf-8") as f:
            known = torch_checks.torchrun_options(f.read())
        assert set(options.OWNED_OPTIONS) <= known
        # What users may still tune: rdzv_conf adds to ours, max_restarts, nproc.
        for free in ("rdzv-conf", "max-restarts", "nproc-per-node", "local-addr"):
            assert free not in options.OWNED_OPTIONS

    def test_check_owned_false_reads_our_own_command(self):
        assert parse_options(["--nnodes", "2"], check_owned=False) == {"nnodes": "2"}


class TestOptionsToArgv:
    def test_each_kind_of_value(self):
        assert options_to_argv(
            {"a": "1", "flag": True, "off": False, "gone": None, "many": ["x", "y"], "n": 5}
        ) == ["--a", "1", "--flag", "--many", "x", "y", "--n", "5"]

    def test_round_trip_with_parse_options(self):
        opts = {"role": "w", "virtual-local-rank": True, "k": "a", "x": "-1"}
        assert parse_options(options_to_argv(opts)) == opts


# --------------------------------------------------------------------------- build_command


def _launch(**over):
    base = dict(
        python="/venv/bin/python",
        num_nodes=2,
        node_index=0,
        nproc_per_node=4,
        rdzv_host="10.0.0.1",
        rdzv_port=29500,
        rdzv_id="Flow-1-train-2-0",
        entrypoint="/abs/train.py",
    )
    base.update(over)
    return Launch(**base)


def _options_of(argv):
    """The option part of the command: between `-m AGENT_MODULE` and `--module`."""
    assert argv[1:3] == ["-m", AGENT_MODULE]
    end = argv.index("--module")
    return parse_options(argv[3:end], check_owned=False)


class TestBuildCommand:
    def test_default_options_node0(self):
        argv = build_command(_launch())
        assert argv[0] == "/venv/bin/python"
        assert _options_of(argv) == {
            "nnodes": "2",
            "nproc-per-node": "4",
            "rdzv-backend": "static",
            "node-rank": "0",
            "rdzv-endpoint": "10.0.0.1:29500",
            "rdzv-id": "Flow-1-train-2-0",
            "rdzv-conf": "timeout=1200",
            "max-restarts": "0",
        }

    def test_restarts_use_c10d_hosted_by_node_0(self):
        argv = build_command(_launch(user_options={"max-restarts": "2"}))
        assert _options_of(argv) == {
            "nnodes": "2",
            "nproc-per-node": "4",
            "rdzv-backend": "c10d",
            "rdzv-endpoint": "10.0.0.1:29500",
            "rdzv-id": "Flow-1-train-2-0",
            "rdzv-conf": "is_host=1,join_timeout=1200",
            "max-restarts": "2",
        }

    @pytest.mark.parametrize("index", [1, 2, 7])
    def test_only_node_0_hosts_the_rendezvous(self, index):
        argv = build_command(_launch(num_nodes=8, node_index=index, user_options={"max-restarts": "1"}))
        assert _options_of(argv)["rdzv-conf"] == "is_host=0,join_timeout=1200"
        static = _options_of(build_command(_launch(num_nodes=8, node_index=index)))
        assert static["node-rank"] == str(index) and static["rdzv-backend"] == "static"

    def test_every_option_appears_once(self):
        argv = build_command(_launch(user_options={"max-restarts": "2", "nnodes": "3"}))
        flags = [a for a in argv[3 : argv.index("--module")] if a.startswith("--")]
        assert len(flags) == len(set(flags))

    def test_tail_runs_the_bootstrap_module_then_the_entry(self):
        # The script's own arguments travel in a file (entry.py), never here.
        argv = build_command(_launch())
        assert argv[-3:] == ["--module", BOOTSTRAP_MODULE, "/abs/train.py"]
        assert argv.count("--module") == 1

    def test_the_started_modules_are_the_modules_themselves(self):
        """What the launcher starts, and what the tests look for (tests/our_processes.py)."""
        from metaflow_extensions.torchrun.plugins.torchrun.procs import agent, bootstrap

        assert (AGENT_MODULE, BOOTSTRAP_MODULE) == (agent.__name__, bootstrap.__name__)

    @pytest.mark.parametrize(
        "host, endpoint",
        [
            ("10.0.0.1", "10.0.0.1:29500"),
            ("node-0.svc.cluster.local", "node-0.svc.cluster.local:29500"),
            ("::1", "[::1]:29500"),
            ("fe80::1:2", "[fe80::1:2]:29500"),
            ("[::1]", "[::1]:29500"),
            ("2001:db8::8a2e:370:7334", "[2001:db8::8a2e:370:7334]:29500"),
        ],
    )
    def test_endpoint_brackets_ipv6(self, host, endpoint):
        assert format_endpoint(host, 29500) == endpoint
        assert _options_of(build_command(_launch(rdzv_host=host)))["rdzv-endpoint"] == endpoint

    def test_user_options_override_defaults(self):
        argv = build_command(
            _launch(
                user_options={
                    "max-restarts": "3",
                    "rdzv-backend": "static",
                    "rdzv-endpoint": "other:1234",
                    "nnodes": "1:4",
                }
            )
        )
        opts = _options_of(argv)
        assert opts["max-restarts"] == "3"
        assert opts["rdzv-backend"] == "static"  # check_owned=False: our own parsing
        assert opts["rdzv-endpoint"] == "other:1234"
        assert opts["nnodes"] == "1:4"
        assert opts["rdzv-id"] == "Flow-1-train-2-0"  # untouched defaults stay

    def test_user_options_add_flags_and_lists(self):
        opts = _options_of(
            build_command(_launch(user_options={"standalone": True, "tee": "3", "x": "a"}))
        )
        assert opts["standalone"] is True and opts["tee"] == "3" and opts["x"] == "a"

    @pytest.mark.parametrize("removed", [None, False])
    def test_user_none_or_false_removes_a_default(self, removed):
        argv = build_command(_launch(user_options={"rdzv-conf": removed}))
        assert "--rdzv-conf" not in argv
        assert "rdzv-conf" not in _options_of(argv)

    def test_max_restarts_default_and_override(self):
        assert _options_of(build_command(_launch()))["max-restarts"] == "0"
        assert _options_of(build_command(_launch(user_options={"max-restarts": "5"})))["max-restarts"] == "5"

    def test_nproc_keyword(self):
        assert _options_of(build_command(_launch(nproc_per_node="gpu")))["nproc-per-node"] == "gpu"

    def test_default_options_is_a_fresh_dict(self):
        launch = _launch()
        a = default_options(launch)
        a["nnodes"] = "changed"
        assert default_options(launch)["nnodes"] == "2"

    def test_torchrun_itself_parses_the_command(self):
        # The real judge of the argv: torchrun's own parser.
        run = pytest.importorskip("torch.distributed.run")
        argv = build_command(
            _launch(
                node_index=1,
                rdzv_host="::1",
                user_options={"monitor-interval": "1"},
            )
        )
        ns = run.get_args_parser().parse_args(argv[3:])
        assert ns.nnodes == "2"
        assert ns.nproc_per_node == "4"
        assert ns.rdzv_backend == "static"
        assert ns.node_rank == 1
        assert ns.rdzv_endpoint == "[::1]:29500"
        assert ns.rdzv_id == "Flow-1-train-2-0"
        assert ns.rdzv_conf == "timeout=1200"
        assert ns.max_restarts == 0
        assert ns.monitor_interval == 1
        assert ns.module is True
        assert ns.training_script == BOOTSTRAP_MODULE
        # the script and its own args travel in the entry file (entry.py)
        assert ns.training_script_args == ["/abs/train.py"]


