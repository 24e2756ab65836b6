"""launch/platforms.py: settings that fail only on a platform, refused at step_init."""

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.platforms import (
    check_port_clash,
    kubernetes_port,
    refuse_step_functions,
)

K8S = [("kubernetes", {"port": 29400, "gpu": 2})]


def test_the_exposed_port_reads_as_metaflow_writes_it():
    assert kubernetes_port(K8S) == 29400
    assert kubernetes_port([("kubernetes", {"port": "None"})]) is None  # no port: Metaflow's "None"
    assert kubernetes_port([("batch", {"port": 29400})]) is None


def test_rendezvous_on_the_exposed_port_is_refused_naming_both_and_the_fix():
    with pytest.raises(TorchrunInvalidArgument) as e:
        check_port_clash(K8S, None, 29400)
    text = str(e.value)
    assert "@kubernetes(port=29400) and @torchrun(rdzv_port)=29400" in text
    assert "Drop @torchrun(rdzv_port)" in text and "pin it to another port" in text
    with pytest.raises(TorchrunInvalidArgument, match="master_port=29400"):
        check_port_clash(K8S, None, 29400, "master_port")


@pytest.mark.parametrize("specs, gang_port, rdzv_port", [
    (K8S, None, 29401),  # another port
    (K8S, None, None),  # the gang picks a free one per call
    (K8S, 29500, 29400),  # @torchrun(port) moves the gang off the exposed port
    ([("batch", {})], None, 29400),  # no port exposed
    ([], None, 29400),  # a local run
])
def test_no_clash(specs, gang_port, rdzv_port):
    check_port_clash(specs, gang_port, rdzv_port)


@pytest.mark.parametrize("argv", [
    ["flow.py", "step-functions", "create"],
    ["flow.py", "--with", "retry", "step-functions", "create", "--only-json"],
])
def test_step_functions_create_is_refused(argv):
    with pytest.raises(TorchrunInvalidArgument, match="argo-workflows create"):
        refuse_step_functions(argv)


@pytest.mark.parametrize("argv", [
    ["flow.py", "run"],
    ["flow.py", "argo-workflows", "create"],
    ["flow.py", "step-functions", "list-runs"],
    ["flow.py", "run", "--tag", "step-functions"],
])
def test_other_commands_are_not(argv):
    refuse_step_functions(argv)


def test_one_node_on_kubernetes_is_refused_naming_what_works():
    from metaflow_extensions.torchrun.plugins.torchrun.launch.platforms import refuse_one_node_on_kubernetes

    with pytest.raises(TorchrunInvalidArgument, match="TorchrunSingleNodeMultiGPU"):
        refuse_one_node_on_kubernetes(K8S, ["1"])
    refuse_one_node_on_kubernetes(K8S, ["2"])
    refuse_one_node_on_kubernetes(K8S, ["self.nodes"])  # known only at run time: Metaflow's refusal stands
    refuse_one_node_on_kubernetes([("batch", {})], ["1"])  # Batch runs a one-node MNP job
    refuse_one_node_on_kubernetes([], ["1"])  # local: one node, several processes
