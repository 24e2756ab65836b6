"""nproc_per_node derived from the step's resource decorators (issue: GPU count)."""

import pytest
from metaflow.plugins.aws.batch.batch_decorator import BatchDecorator
from metaflow.plugins.kubernetes.kubernetes_decorator import KubernetesDecorator
from metaflow.plugins.resources_decorator import ResourcesDecorator

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import (
    NEURON_CORES_PER_DEVICE,
    Accelerators,
    check_visible_devices,
    requested_accelerators,
)
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, resolve_nproc


def specs(*decos):
    """(name, attributes) of real Metaflow decorator objects, as step_init sees them."""
    return [(d.name, d.attributes) for d in decos]


@pytest.mark.parametrize(
    "decos, expected",
    [
        ([], None),
        ([ResourcesDecorator(attributes={"gpu": 2})], 2),
        ([ResourcesDecorator(attributes={"gpu": 0})], None),
        ([ResourcesDecorator(attributes={"cpu": 4})], None),
        ([KubernetesDecorator(attributes={"gpu": 4})], 4),
        ([KubernetesDecorator(attributes={"gpu": "8"})], 8),
        ([KubernetesDecorator(attributes={})], None),
        # Kubernetes: a GPU count in @resources replaces @kubernetes' own (Metaflow's rule).
        ([KubernetesDecorator(attributes={"gpu": 4}), ResourcesDecorator(attributes={"gpu": 2})], 2),
        ([KubernetesDecorator(attributes={"gpu": 2}), ResourcesDecorator(attributes={"gpu": 8})], 8),
        # Before Metaflow 2.16 @resources defaults gpu to "0", which replaces @kubernetes' count
        # in the pod Metaflow builds: no GPU, and so no derived nproc.
        (
            [KubernetesDecorator(attributes={"gpu": 4}), ResourcesDecorator(attributes={"cpu": 2})],
            4 if ResourcesDecorator.defaults.get("gpu") is None else None,
        ),
        ([BatchDecorator(attributes={"gpu": 4})], 4),
        # Batch: the larger of @batch and @resources wins (compute_resource_attributes).
        ([BatchDecorator(attributes={"gpu": 4}), ResourcesDecorator(attributes={"gpu": 2})], 4),
        ([BatchDecorator(attributes={"gpu": 1}), ResourcesDecorator(attributes={"gpu": 2})], 2),
        ([BatchDecorator(attributes={}), ResourcesDecorator(attributes={"gpu": 3})], 3),
        ([BatchDecorator(attributes={"gpu": "2.0"})], 2),
        # Trainium/Inferentia devices -> NeuronCores.
        ([BatchDecorator(attributes={"trainium": 16})], 16 * NEURON_CORES_PER_DEVICE),
        ([BatchDecorator(attributes={"inferentia": 1})], NEURON_CORES_PER_DEVICE),
    ],
)
def test_derived_nproc(decos, expected):
    assert requested_accelerators(specs(*decos)).nproc == expected


def test_decorator_from_the_command_line_counts_like_any_other():
    # `run --with kubernetes:gpu=4` builds the decorator from a string spec.
    # Metaflow's own spec parser: public from 2.16 on, a private classmethod before.
    parse = getattr(KubernetesDecorator, "parse_decorator_spec", None) or KubernetesDecorator._parse_decorator_spec
    deco = parse("gpu=4")
    assert requested_accelerators(specs(deco)).nproc == 4


def test_source_is_named_for_messages():
    acc = requested_accelerators(
        specs(BatchDecorator(attributes={"gpu": 1}), ResourcesDecorator(attributes={"gpu": 2}))
    )
    assert acc.source == "max(@batch(gpu=1), @resources(gpu=2))"


@pytest.mark.parametrize("bad", ["two", "1.5", "-1"])
def test_bad_gpu_counts_are_refused(bad):
    with pytest.raises(TorchrunInvalidArgument, match="gpu"):
        requested_accelerators([("resources", {"gpu": bad})])


# The precedence table in the README, one row each:
# run() argument > torchrun_args > @torchrun(nproc_per_node) > derived from resources > 1.
@pytest.mark.parametrize(
    "call, options, deco, derived, expected",
    [
        (5, {"nproc-per-node": "4"}, 3, 2, 5),
        (None, {"nproc-per-node": "4"}, 3, 2, 4),
        (None, {}, 3, 2, 3),
        (None, {}, None, 2, 2),
        (None, {}, None, None, 1),
    ],
)
def test_precedence_table(call, options, deco, derived, expected):
    defaults = StepDefaults(nproc_per_node=deco, derived_nproc=derived)
    assert resolve_nproc(call, options, defaults) == expected


GPU2 = Accelerators("gpu", 2, "@resources(gpu=2)")
NONE = Accelerators("none", 0, "no accelerator requested")


def test_more_processes_than_visible_gpus_fails_naming_both_numbers():
    with pytest.raises(TorchrunInvalidArgument) as err:
        check_visible_devices(4, GPU2, cuda_available=True, cuda_count=2)
    assert "nproc_per_node=4" in str(err.value) and "only 2 visible CUDA devices" in str(err.value)


def test_enough_gpus_is_fine():
    assert check_visible_devices(2, GPU2, cuda_available=True, cuda_count=2) is None


def test_gpus_asked_for_but_none_visible_runs_on_cpu_with_a_notice():
    notice = check_visible_devices(2, GPU2, cuda_available=False, cuda_count=0)
    assert "asks for 2 GPUs" in notice and "on CPU" in notice


def test_no_gpu_asked_and_none_visible_says_nothing():
    assert check_visible_devices(1, NONE, cuda_available=False, cuda_count=0) is None
