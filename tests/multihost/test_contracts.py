"""The platform contracts the harness derives from Metaflow's code (contracts.py)
are the ones Metaflow's compute decorators translate into ``current.parallel``.

No namespaces needed: these run everywhere, root or not. Name resolution is
stubbed in-process; the multi-host tests do it for real.
"""

import os
import socket

import pytest

from metaflow.plugins.aws.batch import batch_decorator
from metaflow.plugins.kubernetes import kubernetes_decorator
from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK

from . import contracts

pytestmark = pytest.mark.multihost

IPS = ["10.231.0.2", "10.231.0.3", "10.231.0.4"]
PARALLEL = ("MF_PARALLEL_MAIN_IP", "MF_PARALLEL_NUM_NODES", "MF_PARALLEL_NODE_INDEX",
            "MF_PARALLEL_CONTROL_TASK_ID")


@pytest.fixture
def node_env(monkeypatch):
    """Run Metaflow's translation with exactly one node's environment."""

    def apply(node):
        for name in list(os.environ):
            if name.startswith(("MF_", "AWS_BATCH_", "UBF_")):
                monkeypatch.delenv(name)
        for name, value in node.env.items():
            monkeypatch.setenv(name, value)

    yield apply
    for name in PARALLEL:
        os.environ.pop(name, None)


def _parallel():
    return {name: os.environ.get(name) for name in PARALLEL}


@pytest.mark.parametrize("port", [None, 23456])
def test_kubernetes_jobset_nodes(node_env, monkeypatch, port):
    contract = contracts.kubernetes(3, "control-x-0", port)
    names = {}  # what DNS answers: the control's service name
    monkeypatch.setattr(socket, "gethostbyname", lambda name: names[name])
    assert [n.node_index for n in contract.nodes] == [0, 1, 2]
    assert [n.task_id for n in contract.nodes] == ["control-x-0", "control-x-0-worker-0", "control-x-0-worker-1"]
    assert [n.ubf_context for n in contract.nodes] == [UBF_CONTROL, UBF_TASK, UBF_TASK]
    for node in contract.nodes:
        assert node.env["MF_MASTER_ADDR"] == contract.master_name
        assert node.env["MF_MASTER_PORT"] == str(port)  # "None" when no port is set
        assert node.env["MF_WORLD_SIZE"] == "3"
        assert ("MF_CONTROL_INDEX" in node.env) == node.is_control
        assert node.step_options[node.step_options.index("--split-index") + 1] == str(node.node_index)
        # The control pod's own name is MF_MASTER_ADDR (its FQDN in the subdomain).
        assert (contract.master_name in [node.hostname] + node.aliases) == node.is_control
        node_env(node)
        names[contract.master_name] = IPS[0]
        kubernetes_decorator._setup_multinode_environment(node.ubf_context, 5)
        assert _parallel() == {
            "MF_PARALLEL_MAIN_IP": IPS[0],
            "MF_PARALLEL_NUM_NODES": "3",
            "MF_PARALLEL_NODE_INDEX": str(node.node_index),
            "MF_PARALLEL_CONTROL_TASK_ID": "control-x-0",
        }


def test_kubernetes_worker_waits_for_the_control_name(node_env, monkeypatch):
    """A worker that starts before the control's name resolves keeps trying
    (Metaflow's own wait, which the multi-host tests exercise for real)."""
    contract = contracts.kubernetes(2, "control-x-0", None)
    tries = []

    def resolve(name):
        tries.append(name)
        if len(tries) < 3:
            raise socket.gaierror(socket.EAI_NONAME, "not yet")
        return IPS[0]

    monkeypatch.setattr(socket, "gethostbyname", resolve)
    monkeypatch.setattr(kubernetes_decorator.time, "sleep", lambda s: None)
    node_env(contract.nodes[1])
    kubernetes_decorator._setup_multinode_environment(UBF_TASK, 60)
    assert len(tries) == 3 and os.environ["MF_PARALLEL_MAIN_IP"] == IPS[0]


def test_batch_multinode_nodes(node_env, monkeypatch):
    contract = contracts.batch(3, "control-x-0", IPS)
    assert [n.task_id for n in contract.nodes] == ["control-x-0", "x-0-node-1", "x-0-node-2"]
    assert [n.ubf_context for n in contract.nodes] == [UBF_CONTROL, UBF_TASK, UBF_TASK]
    main = contract.nodes[0]
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" not in main.env
    for node in contract.nodes:
        node_env(node)
        # The main node finds its address from its own host name.
        own = IPS[node.node_index]
        monkeypatch.setattr(socket, "gethostname", lambda: node.hostname)
        monkeypatch.setattr(socket, "gethostbyname_ex", lambda name: (name, [], [own]))
        batch_decorator._setup_multinode_environment()
        assert _parallel() == {
            "MF_PARALLEL_MAIN_IP": IPS[0],
            "MF_PARALLEL_NUM_NODES": "3",
            "MF_PARALLEL_NODE_INDEX": str(node.node_index),
            "MF_PARALLEL_CONTROL_TASK_ID": "control-x-0",
        }
