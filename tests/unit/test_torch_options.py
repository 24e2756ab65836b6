"""torchrun's options checked as torch's own parser reads them (issue 38).

``torch_checks`` reads torchrun's options from torch/distributed/run.py
without importing torch (seconds in every task); these tests compare what it
reads with the real ``get_args_parser()``, so the two cannot drift, and show
that a value torchrun would refuse or misread is refused before anything
starts, naming the option, the value and the right spelling.
"""

from __future__ import annotations

import argparse

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch import torch_checks
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import Launch, build_command, restarts_allowed
from metaflow_extensions.torchrun.plugins.torchrun.launch.options import OWNED_OPTIONS, OptionSpec, parse_options
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import CallRequest, StepDefaults, plan_call, plan_request



def _run():
    """torchrun's own module, imported by the first test that reads it, not as the file is
    collected (tools/pools.py: a collection without torch, which compiles apart)."""
    return pytest.importorskip("torch.distributed.run")


def entry():
    """A module-level function: a plan's entrypoint without a script."""


def real_specs():
    """Canonical name -> (takes a value, type) from the parser torch really builds."""
    out = {}
    for action in _run().get_args_parser()._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        kind = action.type if action.type in (int, float) else str
        out[longs[0][2:].replace("_", "-")] = (action.nargs != 0, kind.__name__, action.choices)
    return out


def refused(torchrun_args, defaults=None):
    with pytest.raises(TorchrunInvalidArgument) as info:
        plan_call(entry, None, None, torchrun_args, defaults or StepDefaults(), [])
    return info.value.message


class TestReadFromSource:
    def test_every_option_of_the_real_parser_is_read_alike(self):
        with open(torch_checks.find_torch().run_py, encoding="utf-8") as f:
            read = torch_checks.torchrun_option_specs(f.read())
        real = real_specs()
        assert set(read) == set(real)
        for name, spec in read.items():
            takes_value, kind, choices = real[name]
            assert (spec.takes_value, spec.type) == (takes_value, kind), name
            # Literal choices are read; computed ones are left to torch's parser.
            assert spec.choices is None or list(spec.choices) == list(choices), name

    def test_the_task_reads_them_without_importing_torch(self):
        specs = torch_checks.known_option_specs()
        assert specs["max-restarts"] == OptionSpec(True, "int")
        assert specs["virtual-local-rank"] == OptionSpec(False)

    def test_options_we_read_are_checked_when_torchs_source_is_unreadable(self, monkeypatch):
        monkeypatch.setattr(torch_checks, "find_torch", lambda: torch_checks.TorchInstall(None))
        assert torch_checks.known_option_specs() == torch_checks.READ_BY_US
        assert "--max-restarts" in refused({"max_restarts": None})

    def test_a_call_finds_its_torch_once(self, monkeypatch, tmp_path):
        """``require_torch`` reads torchrun's options for the whole plan: the
        step's and the call's options are checked against that one reading."""
        script = tmp_path / "train.py"
        script.write_text("pass\n")
        found = []
        real = torch_checks.find_torch
        monkeypatch.setattr(torch_checks, "find_torch", lambda: found.append(1) or real())
        request = CallRequest(str(script), None, None, {"max_restarts": 0, "monitor_interval": 1})
        plan = plan_request(request, StepDefaults(torchrun_args={"monitor_interval": 2}), [str(tmp_path)])
        assert plan.options["monitor-interval"] == "1" and len(found) == 1

    def test_an_action_it_cannot_classify_is_left_unchecked(self):
        source = 'def get_args_parser():\n    parser.add_argument("--odd", action=Weird)\n' \
                 '    parser.add_argument("--many", nargs="+")\n    parser.add_argument("--on", action="store_true")\n'
        assert torch_checks.torchrun_option_specs(source) == {"on": OptionSpec(False)}


class TestValueOptions:
    """Issue 38: {"max_restarts": None} became a bare --max-restarts; the agents
    started and died on torch's parser, and the bare flag switched on c10d."""

    @pytest.mark.parametrize("value", [None, True, "", "  "])
    def test_a_value_option_without_a_value_is_refused(self, value):
        message = refused({"max_restarts": value})
        assert message.startswith("torchrun_args['max_restarts'] is %r, but torchrun's --max-restarts takes an "
                                  "integer" % (value,))
        assert "write {'max_restarts': 2}, or {'max_restarts': False} to leave it out." in message

    def test_none_names_what_it_meant_in_0_2(self):
        assert "None was metaflow-torchrun 0.2's bare flag" in refused({"max_restarts": None})

    @pytest.mark.parametrize("value", ["two", "1.5", 1.5, "9" * 5000])
    def test_an_int_option_takes_an_integer(self, value):
        assert "takes an integer" in refused({"max_restarts": value})

    def test_an_option_with_choices(self):
        assert refused({"start_method": "forkk"}) == (
            "torchrun_args['start_method'] is 'forkk', but torchrun's --start-method takes one of 'spawn', "
            "'fork', 'forkserver' (did you mean 'fork'?).")

    def test_a_float_option_takes_a_number(self):
        assert "--monitor-interval takes a number" in refused({"monitor_interval": "soon"})

    def test_argv_with_nothing_after_a_value_option(self):
        message = refused(["--max-restarts"])
        assert message == ("torchrun_args: --max-restarts has no value after it, but torchrun's --max-restarts "
                           "takes an integer: write ['--max-restarts', '2'].")
        assert "takes an integer" in refused(["--max-restarts", "--role", "w"])

    def test_argv_value_of_the_wrong_type(self):
        assert refused(["--max-restarts=x"]).startswith("torchrun_args: the value of --max-restarts is 'x'")

    def test_0_2_pairs(self):
        message = refused(["max_restarts", None])
        assert message.startswith("torchrun_args ['max_restarts', None] is None, but torchrun's --max-restarts")
        assert "[..., 'max_restarts', 2]" in message

    def test_the_decorators_options_too_and_every_problem_at_once(self):
        message = refused({"monitor_interval": None}, StepDefaults(torchrun_args={"max_restarts": True}))
        assert "@torchrun(torchrun_args)['max_restarts'] is True" in message
        assert "torchrun_args['monitor_interval'] is None" in message

    @pytest.mark.parametrize("given, typed", [(2, 2), ("3", 3), (" 4 ", 4), ("-1", -1), (False, False)])
    def test_accepted_values_are_typed(self, given, typed):
        options = plan_call(entry, None, None, {"max_restarts": given}, StepDefaults(), []).options
        assert options["max-restarts"] == typed and type(options["max-restarts"]) is type(typed)

    @pytest.mark.parametrize("args", [{"max_restarts": None}, {"max_restarts": True}, ["--max-restarts"],
                                      ["max_restarts", None], {"max_restarts": "x"}])
    def test_restarts_are_never_allowed_by_a_value_torch_refuses(self, args):
        refused(args)
        assert restarts_allowed({"max-restarts": True}) is False
        assert restarts_allowed({"max-restarts": "x"}) is False


class TestFlags:
    @pytest.mark.parametrize("value", [None, True])
    def test_a_flag_passed(self, value):
        options = plan_call(entry, None, None, {"virtual_local_rank": value}, StepDefaults(), []).options
        assert options == {"virtual-local-rank": True}

    @pytest.mark.parametrize("value", ["yes", 1, "true", 0, ""])
    def test_a_flag_given_a_value_is_refused(self, value):
        message = refused({"virtual_local_rank": value})
        assert message == (
            "torchrun_args['virtual_local_rank'] is %r, but torchrun's --virtual-local-rank is a flag and takes "
            "no value: write {'virtual_local_rank': True} to pass it, or {'virtual_local_rank': False} to leave "
            "it out." % (value,))

    def test_argv_flag_followed_by_a_value(self):
        assert refused(["--virtual-local-rank", "x"]) == (
            "torchrun_args: --virtual-local-rank is a flag and takes no value, but is given 'x': write "
            "'--virtual-local-rank' alone.")
        assert "is a flag" in refused(["--virtual-local-rank=1"])


def test_every_accepted_value_reaches_torchs_parser_as_given():
    """For every option a user may set, a value of its type passes our checks
    and torch's parser reads the command we build back to that value."""
    launch = dict(python="py", num_nodes=2, node_index=1, nproc_per_node=2, rdzv_host="10.0.0.1",
                  rdzv_port=29500, rdzv_id="x", entrypoint="/e.json", local_addr="10.0.0.2")
    samples = {"int": (7, 7), "float": ("0.25", 0.25), "str": ("v1", "v1")}
    for name, spec in torch_checks.known_option_specs().items():
        if name in OWNED_OPTIONS or name in ("nproc-per-node", "print-completion"):
            continue  # (torch 2.14's --print-completion prints a script and exits as it is parsed)
        given, expected = (True, True) if not spec.takes_value else samples[spec.type]
        if spec.choices:
            given = expected = spec.choices[-1]
        if name == "numa-binding":
            given = expected = "node"  # computed choices, left to torch
        options = parse_options({name: given}, specs=torch_checks.known_option_specs())
        parsed = _run().get_args_parser().parse_args(build_command(Launch(user_options=options, **launch))[3:])
        got = getattr(parsed, name.replace("-", "_"))
        if name.endswith("-filters"):
            got = ",".join(got)  # torch splits these at commas
        if name == "rdzv-conf":
            got = got.split(",")[-1]  # merged with ours (command._merge_rdzv_conf)
        assert got == expected, name
