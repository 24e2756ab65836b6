"""@torchrun(preflight="full") across hosts: a host whose link is throttled with
``tc`` (both ways: the bridge port towards it and its own eth0) is named slow,
and the job's figures reach the control's record."""

import json
import os
import subprocess

import pytest

from .harness import FLOWS, PlatformRun

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

GANG = os.path.join(FLOWS, "gang_flow.py")
REPORT = ["--script", "report.py", "--nproc", "1"]
RATE = "40mbit"  # about 0.005 GB/s against a veth's GB/s


def _throttle(host) -> None:
    shape = ["tc", "qdisc", "add", "dev", "%s", "root", "tbf", "rate", RATE, "burst", "64kb", "latency", "200ms"]
    for ns, dev in ((host.switch, host.port), (host.netns, "eth0")):
        argv = ["ip", "netns", "exec", ns] + [dev if a == "%s" else a for a in shape]
        subprocess.run(argv, check=True, capture_output=True)


def test_a_throttled_host_is_named_slow(network, sandbox):
    hosts = network(3)
    if subprocess.run(["tc", "-V"], capture_output=True).returncode:
        pytest.skip("no tc here")
    _throttle(hosts.hosts[2])
    env = {"MFTR_TORCHRUN_ATTRS": json.dumps({"preflight": "full", "heartbeat_timeout": 120})}
    run = PlatformRun(sandbox, hosts, "kubernetes", GANG, params=REPORT, env=env)
    run.prepare()
    codes = run.run_nodes(timeout=240)
    run.complete(codes)
    log = run.node_log(0)
    assert "@torchrun: preflight: node 2 is slow:" in log, run.logs_summary()
    assert "node 1 is slow" not in log
    record = run.client(
        "t = Task(run + '/train/%s')\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])['preflight']['job']" % run.contract.control_task_id)
    assert record["slow"] == [2] and set(record["link_gbps"]) == {"1", "2"}
    assert record["link_gbps"]["2"] < 0.5 * record["link_gbps"]["1"]
