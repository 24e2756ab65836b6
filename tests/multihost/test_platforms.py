"""Real flows with one node per host, each started as Kubernetes (a JobSet pod)
or AWS Batch (a node of a multi-node parallel job) starts it.

Kubernetes: MF_MASTER_ADDR is a DNS name that the other pods can resolve only
some seconds after the control starts; MF_MASTER_PORT is "None" (no
``@kubernetes(port=...)``) or a number. AWS Batch: the main node has no
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS and finds its own address from its
host name. contracts.py says where each variable comes from.

Every test ends with the join step, run on the tasks the platform started, and
checks that the control task named exactly those tasks for it; the hello tests
run the end step too and check that Metaflow counts the run as successful.
"""

import os
import sys
import time

import pytest

from .harness import EXAMPLES, FLOWS, PlatformRun

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(180)]

HELLO = os.path.join(EXAMPLES, "hello", "flow.py")
DDP = os.path.join(EXAMPLES, "ddp", "flow.py")
GANG = os.path.join(FLOWS, "gang_flow.py")
# Scenarios other than hello and DDP run one process per node: what they test is
# between nodes, and the machine has 2 cores.
REPORT = ["--script", "report.py", "--nproc", "1"]


def _complete(run, codes, *join_artifacts, end=False):
    done = run.complete(codes, join_artifacts, end=end)
    assert sorted(done["mapper_tasks"]) == sorted(run.task_pathspecs())
    if end:
        assert done["successful"] is True  # Metaflow's own verdict on the run
    return done["join"]


def _check_reports(sandbox, nodes=2, nproc=2):
    reports = sandbox.reports("rank-")
    world = nodes * nproc
    assert sorted(reports) == list(range(world)), reports
    assert {r["world"] for r in reports.values()} == {world}
    assert {r["sum"] for r in reports.values()} == {sum(range(world))}
    assert sorted(r["node_index"] for r in reports.values()) == sorted(
        i for i in range(nodes) for _ in range(nproc))


@pytest.mark.parametrize("platform", ["kubernetes", "batch"])
def test_hello_two_hosts_two_processes(network, sandbox, platform):
    run = PlatformRun(sandbox, network(2), platform, HELLO)
    run.prepare()
    _complete(run, run.run_nodes(timeout=120), end=True)
    for i, node in enumerate(run.nodes):
        lines = [l for l in run.node_log(i).splitlines() if "hello from rank" in l]
        # Two ranks per node, each on the host the platform gave that node.
        assert len(lines) == 2, run.logs_summary()
        assert all("of 4" in l and "all-reduce sum 6" in l and "host %s)" % node.hostname in l
                   for l in lines), lines


@pytest.mark.parametrize("platform,port", [("kubernetes", 23456), ("batch", None)],
                         ids=["kubernetes-with-port", "batch"])
def test_ddp_two_hosts_two_processes(network, sandbox, platform, port):
    run = PlatformRun(sandbox, network(2), platform, DDP, params=["--epochs", "2"], port=port)
    run.prepare()
    codes = run.run_nodes(timeout=150)
    metrics = _complete(run, codes, "metrics")["metrics"]
    assert metrics["world_size"] == 4
    assert metrics["final_loss"] < metrics["initial_loss"]
    if port is not None:
        # @kubernetes(port=...) is the port the JobSet exposes: the gang uses it.
        assert port in run.control_listeners.seen, sorted(run.control_listeners.seen)


def test_kubernetes_nodes_started_in_reverse_order(network, sandbox):
    """Workers can be up long before the control is reachable by name (the JobSet
    creates the control job first, but pods are scheduled and DNS records
    published when they are). Here the worker starts 4 s before the control,
    whose name resolves only 2 s after it starts: the worker waits for the name
    (Metaflow), then for the gang (@torchrun), and they meet. AWS Batch always
    starts the main node first, so this is Kubernetes only."""
    run = PlatformRun(sandbox, network(2), "kubernetes", GANG, params=REPORT, dns_delay=2.0)
    run.prepare()
    codes = run.run_nodes(timeout=150, order=[1, 0], gap=4.0)
    assert _complete(run, codes, "node_indices")["node_indices"] == [0, 1]
    _check_reports(sandbox, nproc=1)
    # The worker ran for 6 s (4 + 2) with a control name that did not resolve.
    assert run.dns_published_at - run.launched_at[1] >= 5.5


def test_default_port_taken_on_the_control_host(network, sandbox):
    """Something already listens on the first port the gang would use on the
    control host: the control takes the next candidate, the workers find it.
    AWS Batch gives no port; Kubernetes without @kubernetes(port=...) takes the
    same path (MF_MASTER_PORT "None")."""
    from metaflow_extensions.torchrun.plugins.torchrun.gang import ports
    from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity

    net = network(2)
    run = PlatformRun(sandbox, net, "batch", GANG, params=REPORT)
    gang_id = GangIdentity(run.flow_name, run.run_id, run.step, run.contract.control_task_id, 0).gang_id
    # The nodes get no port (MF_MASTER_PORT "None" / Batch): candidates from the gang id.
    candidates = ports.choose_ports({}, gang_id)
    blocker = net.hosts[0].popen(
        [sys.executable, "-c",
         "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', %d)); s.listen(); "
         "print('taken', flush=True); time.sleep(600)" % candidates[0]],
        sandbox.env, sandbox.log_path("blocker"))
    try:
        deadline = time.monotonic() + 10
        while "taken" not in sandbox.read_log("blocker"):
            assert blocker.poll() is None and time.monotonic() < deadline, sandbox.read_log("blocker")
            time.sleep(0.05)
        run.prepare()
        codes = run.run_nodes(timeout=150)
        _complete(run, codes)
        _check_reports(sandbox, nproc=1)
        assert candidates[1] in run.control_listeners.seen, (candidates, sorted(run.control_listeners.seen))
    finally:
        blocker.kill()
        blocker.wait()
