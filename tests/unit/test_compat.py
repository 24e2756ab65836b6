"""compat.py: Metaflow versions, metaflow-torchrun 0.2 code, the torch a task has."""

import os
import textwrap

import pytest

from metaflow_extensions.torchrun.plugins.torchrun import compat
from metaflow_extensions.torchrun.plugins.torchrun.record.step_record import meta_datum
from metaflow_extensions.torchrun.plugins.torchrun.launch import torch_checks
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunException, TorchrunInvalidArgument


# ------------------------------------------------------------------ Metaflow versions


class TestInsertedBy:
    def test_passed_to_an_init_that_takes_it(self):
        def init(self, attributes=None, statically_defined=False, inserted_by=None):
            pass

        assert compat.decorator_init_kwargs(init, ["x"]) == {"inserted_by": ["x"]}

    def test_left_out_for_metaflow_before_2_16(self):
        def init(self, attributes=None, statically_defined=False):
            pass

        assert compat.decorator_init_kwargs(init, ["x"]) == {}

    def test_kwargs_catch_all_takes_it(self):
        def init(self, *args, **kwargs):
            pass

        assert compat.decorator_init_kwargs(init, None) == {"inserted_by": None}

    def test_the_installed_metaflow(self):
        from metaflow.plugins.parallel_decorator import ParallelDecorator

        # Whatever the version, the call this produces is one the parent accepts.
        kwargs = compat.decorator_init_kwargs(ParallelDecorator.__init__, None)
        ParallelDecorator(attributes={}, statically_defined=False, **kwargs)


def test_meta_datum_is_metaflows():
    fields = meta_datum()._fields  # its home is record/step_record.py, beside its one user
    assert fields == ("field", "value", "type", "tags")


@pytest.mark.parametrize(
    "worker, control",
    [
        # Metaflow's local runtime: the control is control-<run>-<step>-<n>, workers <run>-<step>-<n>_node_<i>.
        ("1795-start-1_node_1", "control-1795-start-1"),
        ("1795-start-1_node_12", "control-1795-start-1"),
        ("control-1795-start-1_node_1", "control-1795-start-1"),
    ],
)
def test_a_local_worker_derives_its_control_task_id(worker, control):
    assert compat.local_control_task_id(worker) == control


# ------------------------------------------------------------- 0.2 attribute names


class TestAttributeAliases:
    def test_old_names_become_new_ones_with_one_line_each(self):
        legacy = compat.translate_attributes({"master_port": "3339", "all_nodes_started_timeout": 480})
        # 0.2's master_port was torchrun's rendezvous port: rdzv_port here.
        assert legacy.attributes == {"rdzv_port": "3339", "start_timeout": 480}
        assert len(legacy.deprecations) == 2
        assert "master_port= is deprecated" in legacy.deprecations[0]
        assert "rdzv_port=" in legacy.deprecations[0] and "@torchrun(port=N)" in legacy.deprecations[0]
        assert "start_timeout=" in legacy.deprecations[1]
        assert legacy.conflicts == []

    def test_new_names_untouched(self):
        legacy = compat.translate_attributes({"port": 1234, "nproc_per_node": 2})
        assert legacy.attributes == {"port": 1234, "nproc_per_node": 2}
        assert legacy.deprecations == [] and legacy.conflicts == []

    def test_none_attributes(self):
        assert compat.translate_attributes(None).attributes == {}

    def test_both_spellings_with_different_values_conflict(self):
        legacy = compat.translate_attributes({"master_port": 1, "rdzv_port": 2})
        assert legacy.conflicts and "give only rdzv_port" in legacy.conflicts[0]
        with pytest.raises(TorchrunInvalidArgument, match="give only rdzv_port"):
            compat.legacy_notes(legacy, print, ["flow.py", "run"])

    def test_both_spellings_with_the_same_value_are_fine(self):
        legacy = compat.translate_attributes({"master_port": 1, "rdzv_port": 1})
        assert legacy.attributes == {"rdzv_port": 1} and not legacy.conflicts

    def test_input_not_mutated(self):
        given = {"master_port": 1}
        compat.translate_attributes(given)
        assert given == {"master_port": 1}

    def test_said_by_the_command_not_by_every_task(self):
        legacy = compat.translate_attributes({"master_port": 1})
        said = []
        compat.legacy_notes(legacy, said.append, ["flow.py", "run"])
        assert len(said) == 1
        said.clear()
        compat.legacy_notes(legacy, said.append, ["flow.py", "--quiet", "step", "train", "--run-id", "1"])
        assert said == []


@pytest.fixture
def outside_a_step(monkeypatch):
    """Other unit tests leave Metaflow's ``current`` set up as in a task."""
    from metaflow import current

    monkeypatch.setattr(type(current), "is_running_flow", property(lambda self: False))


def test_single_node_launcher_outside_a_step_says_where_it_runs(outside_a_step):
    with pytest.raises(TorchrunException, match="in a step's code"):
        compat.TorchrunSingleNodeMultiGPU().run(entrypoint="script.py", nproc_per_node=2)


def test_single_node_launcher_is_importable_from_metaflow(outside_a_step):
    from metaflow import TorchrunSingleNodeMultiGPU

    with pytest.raises(TorchrunException, match="in a step's code"):
        TorchrunSingleNodeMultiGPU().run(entrypoint="script.py", nproc_per_node=2)


def test_single_node_launcher_refuses_an_unknown_encoding():
    with pytest.raises(TorchrunInvalidArgument, match="args_as"):
        compat.TorchrunSingleNodeMultiGPU(args_as="0.3")


# ------------------------------------------------------------------------- torch

RUN_PY = textwrap.dedent(
    '''
    def get_args_parser():
        parser.add_argument("--nnodes", "--nnodes")
        parser.add_argument("--nproc-per-node", "--nproc_per_node")
        parser.add_argument('--max_restarts')
    def other():
        parser.add_argument("--not-torchrun")
    '''
)


class TestTorchProblem:
    PASSED = ("nnodes", "nproc-per-node", "local-addr")

    def test_no_torch_names_the_install(self):
        msg = torch_checks.torch_problem(torch_checks.TorchInstall(None), "/venv/bin/python", self.PASSED, None)
        assert "torch is not installed for /venv/bin/python" in msg
        # The tested torch, pinned: the [torch] extra would install the newest (2.14.1 and its CUDA packages).
        assert 'pip install "torch==2.13.0" numpy' in msg and "metaflow-torchrun[torch]" not in msg

    def test_no_torch_distributed(self):
        torch = torch_checks.TorchInstall("/site/torch", "2.13.0", None)
        msg = torch_checks.torch_problem(torch, "py", self.PASSED, None)
        assert "no torch.distributed" in msg and torch_checks.TORCH_INSTALL_HINT in msg

    def test_too_old_for_an_option_we_pass(self):
        torch = torch_checks.TorchInstall("/site/torch", "1.13.1", "/site/torch/distributed/run.py")
        msg = torch_checks.torch_problem(torch, "py", self.PASSED, {"nnodes", "nproc-per-node"})
        assert "torch 1.13.1" in msg and "too old" in msg and "--local-addr" in msg
        assert "torch>=%s is supported" % torch_checks.MIN_TORCH in msg

    def test_fine(self):
        torch = torch_checks.TorchInstall("/site/torch", "2.13.0", "/site/torch/distributed/run.py")
        known = {"nnodes", "nproc-per-node", "local-addr"}
        assert torch_checks.torch_problem(torch, "py", self.PASSED, known) is None

    def test_options_unreadable_is_not_a_problem(self):
        torch = torch_checks.TorchInstall("/site/torch", None, "/site/torch/distributed/run.py")
        assert torch_checks.torch_problem(torch, "py", self.PASSED, None) is None

    def test_torchrun_options_from_source(self):
        assert torch_checks.torchrun_options(RUN_PY) == {"nnodes", "nproc-per-node", "max-restarts"}

    def test_passed_options_are_what_the_command_sets(self):
        passed = torch_checks.passed_options()
        for name in ("nnodes", "nproc-per-node", "rdzv-backend", "rdzv-conf", "local-addr", "module"):
            assert name in passed

    def test_find_torch_without_torch(self, tmp_path, monkeypatch):
        monkeypatch.setattr(torch_checks.importlib.util, "find_spec", lambda name: None)
        assert torch_checks.find_torch() == torch_checks.TorchInstall(None)
        with pytest.raises(torch_checks.TorchrunMissingDependency, match=r"pip install \"torch==2\.13\.0\" numpy"):
            torch_checks.require_torch("/x/python")

    def test_find_torch_reads_files(self, tmp_path, monkeypatch):
        pkg = tmp_path / "torch"
        (pkg / "distributed").mkdir(parents=True)
        (pkg / "version.py").write_text("__version__ = '2.99.0+cpu'\n")
        (pkg / "distributed" / "run.py").write_text(RUN_PY)

        class Spec:
            submodule_search_locations = [str(pkg)]

        monkeypatch.setattr(torch_checks.importlib.util, "find_spec", lambda name: Spec())
        found = torch_checks.find_torch()
        assert found.version == "2.99.0+cpu"
        assert found.run_py == os.path.join(str(pkg), "distributed", "run.py")
        # This fake torchrun lacks --local-addr and the rendezvous options we pass.
        with pytest.raises(torch_checks.TorchrunMissingDependency, match="too old.*--local-addr"):
            torch_checks.require_torch()

    def test_missing_dependency_is_a_clean_metaflow_error(self):
        from metaflow.exception import MetaflowException

        assert issubclass(torch_checks.TorchrunMissingDependency, MetaflowException)


@pytest.mark.parametrize("argv,step", [
    (["flow.py", "--quiet", "--datastore", "local", "step", "train", "--run-id", "1"], "train"),
    (["flow.py", "--with", "retry", "step", "end"], "end"),
    (["flow.py", "--no-pylint", "run"], None),
    (["flow.py", "card", "view", "1/train"], None),
    (["flow.py", "step"], None),
    ([], None),
])
def test_the_step_a_task_process_runs_is_read_from_its_command(argv, step):
    assert compat.task_step(argv) == step
