"""Preflight: the typed message, the control's comparison (bounded at 1,024
nodes), each node's checks, and the service refusing a gang over real sockets
before any node gets its go."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from gang_net import GUARD
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages as msg
from metaflow_extensions.torchrun.plugins.torchrun.gang import node_compare as pf
from metaflow_extensions.torchrun.plugins.torchrun.gang import preflight_modes as modes
from metaflow_extensions.torchrun.plugins.torchrun.gang.wire import ProtocolError
from metaflow_extensions.torchrun.plugins.torchrun.launch import node_checks as checks
from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import NONE, Accelerators
from proc_helpers import wait_until

GPUS = Accelerators("gpu", 8, "@kubernetes(gpu=8)")
SAME = {"python": "3.11.9", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3", "cudnn": "9.10",
        "metaflow": "2.19.39", "metaflow_torchrun": "0.3.0", "kernel": "6.8.0"}


# -- the message ------------------------------------------------------------------------


def test_the_message_round_trips_through_the_wire():
    message = msg.Preflight(SAME, (msg.PreflightCheck("shm", "warn", "64 MiB", "2 GiB", "raise it"),))
    back = msg.parse(json.loads(json.dumps(message.to_wire())))
    assert back == message


@pytest.mark.parametrize("bad", [
    {"versions": []},
    {"versions": {"torch": 2.13}},
    {"versions": {"rootkit": "1"}},
    {"versions": {"torch": "x" * (msg.FINGERPRINT_VALUE_CHARS + 1)}},
    {"versions": {}, "checks": {}},
    {"versions": {}, "checks": [{"name": "shm", "status": "maybe"}]},
    {"versions": {}, "checks": [{"name": "", "status": "ok"}]},
    {"versions": {}, "checks": [{"name": "shm", "status": "ok", "found": ["x"]}]},
    {"versions": {}, "checks": [{"name": "shm", "status": "ok"}] * (msg.MAX_CHECKS + 1)},
    {"versions": {}, "checks": ["shm"]},
])
def test_every_field_is_checked(bad):
    with pytest.raises(ProtocolError):
        msg.parse(dict(bad, type="preflight"))


# -- the comparison ------------------------------------------------------------------------


def gang_of(n, odd=None):
    prints = {i: dict(SAME) for i in range(n)}
    for node, changes in (odd or {}).items():
        prints[node].update(changes)
    return prints


def test_a_different_torch_names_the_nodes_and_the_majority_at_1024_nodes():
    prints = gang_of(1024, {3: {"torch": "2.12.0"}, 17: {"torch": "2.12.0"}})
    began = time.perf_counter()
    cause = pf.verdict(prints, {})
    took = time.perf_counter() - began
    assert cause is not None and cause.kind is CauseKind.PREFLIGHT and cause.node_index == 3
    assert "torch: nodes 3, 17 have 2.12.0 (majority 2.13.0 on 1022 nodes)" in cause.summary
    assert "Fix: build every node from one image" in (cause.message or "")
    assert took < 0.5, took  # once per gang, O(nodes x fields)


def test_every_differing_field_is_named_node_by_node():
    cause = pf.verdict(gang_of(5, {1: {"torch": "2.12.0"}, 4: {"nccl": "2.21.5", "python": "3.10.14"}}), {})
    text = cause.message or ""
    assert "torch: node 1 has 2.12.0 (majority 2.13.0 on 4 nodes)" in text
    assert "nccl: node 4 has 2.21.5 (majority 2.27.3 on 4 nodes)" in text
    assert "python: node 4 has 3.10.14 (majority 3.11.9 on 4 nodes)" in text
    rows = pf.rows(gang_of(5, {4: {"nccl": "2.21.5", "python": "3.10.14"}}), {})
    assert rows[0] == {"node": 4, "versions": "differ: python, nccl"} and rows[1]["versions"] == "ok"


def test_a_message_stays_short_when_every_node_differs():
    prints = gang_of(1024, {i: {"torch": "2.%d" % i, "nccl": "n%d" % i} for i in range(1024)})
    cause = pf.verdict(prints, {})
    assert len(cause.message or "") < 2000 and len(cause.summary) < 400
    assert "more values on" in (cause.message or "")


def test_a_kernel_difference_is_said_not_refused():
    prints = gang_of(3, {2: {"kernel": "6.1.0"}})
    assert pf.verdict(prints, {}) is None
    assert pf.warnings(prints, {}) == ["versions differ (not refused): kernel: node 2 has 6.1.0 "
                                       "(majority 6.8.0 on 2 nodes)"]


def test_a_node_that_could_not_measure_is_not_refused():
    prints = gang_of(3)
    prints[2] = {}
    assert pf.verdict(prints, {}) is None


def test_a_failed_check_refuses_naming_node_check_found_expected_and_fix():
    bad = msg.PreflightCheck("gpus", "fail", "4 visible", "at least 8 (@kubernetes(gpu=8))", "ask for fewer")
    cause = pf.verdict(gang_of(2), {0: (), 1: (bad,)})
    assert cause is not None and cause.node_index == 1
    assert cause.summary.endswith("gpus on node 1: found 4 visible, expected at least 8 (@kubernetes(gpu=8)). "
                                  "Fix: ask for fewer")


def test_warnings_are_grouped_by_finding():
    small = msg.PreflightCheck("shm", "warn", "64 MiB", "at least 8 GiB", "raise it")
    ok = msg.PreflightCheck("shm", "ok", "64 GiB", "at least 8 GiB")
    lines = pf.warnings(gang_of(4), {0: (ok,), 1: (small,), 2: (small,), 3: (ok,)})
    assert lines == ["shm on nodes 1, 2: found 64 MiB, expected at least 8 GiB. Fix: raise it"]


def test_the_record_is_bounded_at_1024_nodes():
    small = msg.PreflightCheck("shm", "warn", "64 MiB", "at least 8 GiB", "raise it")
    disk = [msg.PreflightCheck("disk", "warn", "%d MiB free" % i, "1 GiB", "free space") for i in range(1024)]
    prints = gang_of(1024, {i: {"torch": "v%d" % i} for i in range(0, 1024, 2)})
    record = pf.record(prints, {i: (small, disk[i]) for i in range(1024)}, 1024, "versions")
    assert len(json.dumps(record.to_wire())) < 64 * 1024
    assert len(record.rows) == pf.MAX_ROWS and record.reported == 1024


def test_the_service_refuses_before_the_last_node_gets_its_go(net):
    server = net.server(2)
    c0 = net.client(server.config, server.port, 0, connect=False, preflight=lambda: msg.Preflight(SAME))
    c1 = net.client(server.config, server.port, 1, connect=False,
                    preflight=lambda: msg.Preflight(dict(SAME, torch="2.12.0")))
    c0.connect(give_up_after=GUARD)
    ports = {}
    t = threading.Thread(target=lambda: ports.setdefault(0, c0.enter_call(0, "train.py")), daemon=True)
    t.start()
    c1.connect(give_up_after=GUARD)
    assert c1.enter_call(0, "train.py") is None  # no go: the gang is refused
    wait_until(lambda: c0.cause is not None, GUARD)
    assert c0.cause.kind is CauseKind.PREFLIGHT and "node 1 has 2.12.0" in c0.cause.summary
    t.join(GUARD)
    calls = server.handlers.book.calls
    assert calls.get(0) is None or 1 not in calls[0].went  # node 1 never got its go
    assert server.preflight_record("versions").reported == 2


def test_a_second_preflight_from_one_node_drops_it(net):
    server = net.server(3)
    c1 = net.client(server.config, server.port, 1)
    c1._safe_send(msg.Preflight(SAME))
    c1._safe_send(msg.Preflight(SAME))
    wait_until(lambda: server.cause is not None, GUARD)
    assert server.cause.kind is CauseKind.NODE_LOST and server.cause.node_index == 1


# -- each node's checks ----------------------------------------------------------------------


def test_the_fingerprint_imports_no_torch_and_takes_milliseconds():
    code = ("import sys, time; import metaflow\n"
            "from metaflow_extensions.torchrun.plugins.torchrun.launch import node_checks as p\n"
            "t = time.perf_counter(); v = p.fingerprint({}, 0); took = time.perf_counter() - t\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "print(took, v['torch'], v['python'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    took, torch_version, python = out.stdout.split()
    assert float(took) < 0.25 and torch_version.startswith("2.") and python.startswith("3.")


def test_fakes_apply_to_the_named_node_only():
    env = {"METAFLOW_TORCHRUN_FAKE_FINGERPRINT_TORCH": "1=2.12.0,3=2.11.0"}
    assert checks.with_fakes(dict(SAME), env, 1)["torch"] == "2.12.0"
    assert checks.with_fakes(dict(SAME), env, 3)["torch"] == "2.11.0"
    assert checks.with_fakes(dict(SAME), env, 0)["torch"] == "2.13.0"
    assert checks.with_fakes(dict(SAME), {"METAFLOW_TORCHRUN_FAKE_FINGERPRINT_NCCL": "x"}, 0)["nccl"] == "x"


def test_shm_under_a_gib_per_process_warns_with_the_fix():
    check = checks.shm_check(64 << 20, 8)
    assert (check.status, check.found) == ("warn", "64 MiB")
    assert "@kubernetes(shared_memory=<MiB>)" in check.fix and "shared_memory=8192" in check.fix
    assert checks.shm_check(16 << 30, 8).status == "ok"
    assert checks.shm_check(None, 8).status == "ok"


def test_disk_and_gpus():
    assert checks.disk_check(100 << 20, "/tmp").status == "warn"
    assert checks.disk_check(50 << 30, "/tmp").status == "ok"
    assert checks.gpu_check(8, NONE, 0) is None
    assert checks.gpu_check(8, GPUS, 4).status == "fail"
    assert checks.gpu_check(8, GPUS, 0).status == "warn"
    assert checks.gpu_check(8, GPUS, 8).status == "ok"


def test_ncc_is_likely_to_pick_batch_link_local_interface_and_that_warns_on_batch():
    found = [("lo", "127.0.0.1"), ("ecs-eth0", "169.254.172.1"), ("eth0", "10.0.1.5")]
    assert checks.nccl_interface(found) == ("ecs-eth0", "169.254.172.1")
    check = checks.network_check("10.0.1.5", "eth0", found, GPUS, {"AWS_BATCH_JOB_ID": "j"})
    assert check.status == "warn" and "NCCL_SOCKET_IFNAME=eth0" in check.fix
    assert checks.network_check("10.0.1.5", "eth0", found, GPUS, {}).status == "ok"
    assert checks.nccl_interface([("lo", "127.0.0.1"), ("ib0", "10.1.0.1"), ("eth0", "x")])[0] == "ib0"


def test_what_the_user_set_is_reported_never_overridden():
    env = {"AWS_BATCH_JOB_ID": "j", "NCCL_SOCKET_IFNAME": "ecs-eth0"}
    check = checks.network_check("10.0.1.5", "eth0", [("ecs-eth0", "169.254.1.1")], GPUS, env)
    assert check.status == "ok" and "set by you: NCCL_SOCKET_IFNAME=ecs-eth0" in check.found


def test_modes():
    assert modes.parse_mode("versions") == "versions" and modes.parse_mode("FULL") == "full"
    assert modes.parse_mode(False) == modes.parse_mode("off") == modes.parse_mode(None) == "off"
    with pytest.raises(ValueError, match="preflight='fast'"):
        modes.parse_mode("fast")


# -- the collective job's figures -------------------------------------------------------------


def test_a_node_well_below_the_median_is_named_slow():
    returned = {"backend": "gloo", "allreduce_ok": True, "busbw_gbps": 5.0, "size_mib": 4, "home_node": 0,
                "init_s": {0: 0.2, 1: 0.3, 2: 0.2, 3: 0.25},
                "link_gbps": {1: 10.0, 2: 9.0, 3: 2.0}}
    job = pf.job_record(returned, 3.2)
    assert list(job.slow) == [3] and job.link_median_gbps == 9.0
    lines = pf.describe_job(job)
    assert "node 3 is slow: 2 GB/s to node 0, under 50% of the median 9 GB/s" in lines[1]
    assert "process-group init up to 0.30s (node 1)" in lines[0]


def test_junk_from_the_job_is_left_out():
    job = pf.job_record({"link_gbps": {1: "fast", "2": 3.0, 3: float("nan"), 4: True}, "busbw_gbps": "x"}, 1.0)
    assert job.link_gbps == {} and job.busbw_gbps is None and list(job.slow) == []


# -- the job's deadlines on a node (runtime/preflight.py) ---------------------------------------


def _job_run(tmp_path, heartbeat_timeout=10.0, nproc=2):
    """The job's deadlines as its call asks them (CallRun.watch), read from ``tmp_path``'s phases."""
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.preflight import JobDeadlines

    watch = JobDeadlines(heartbeat_timeout, nproc, node_index=1, call=0)
    return SimpleNamespace(watch=watch, stop_reason=lambda: watch.stop_reason(str(tmp_path)),
                           _own_cause=lambda: watch.own_cause(Cause(CauseKind.RANK_FAILED, "as any call's")))


def _phase(tmp_path, local, name):
    from metaflow_extensions.torchrun.plugins.torchrun.procs.collective_check import phase_path

    with open(phase_path(str(tmp_path), local), "w") as f:
        f.write(name)


def test_the_clock_starts_when_the_ranks_have_started(tmp_path):
    run = _job_run(tmp_path)
    run.watch.go_at -= 15  # importing torch took a while: no hang
    assert run.stop_reason() is None and run.watch.started_at is None
    _phase(tmp_path, 0, "init")
    _phase(tmp_path, 1, "ready")
    assert run.stop_reason() is None and run.watch.started_at is not None
    run.watch.started_at -= 11  # heartbeat_timeout later, local rank 1 is outside a collective
    assert run.stop_reason()
    cause = run._own_cause()
    assert cause.kind is CauseKind.PREFLIGHT and not cause.secondary and cause.node_index == 1
    assert "local rank 1 in 'ready'" in cause.summary and "local rank 0" not in cause.summary


def test_ranks_waiting_in_collectives_report_an_echo_later(tmp_path):
    run = _job_run(tmp_path)
    _phase(tmp_path, 0, "allreduce")
    _phase(tmp_path, 1, "allreduce")
    run.stop_reason()
    run.watch.started_at -= 11
    assert run.stop_reason() is None  # waiting: the node to name speaks first
    run.watch.started_at -= 11
    assert run.stop_reason()
    assert run._own_cause().secondary


def test_ranks_that_never_start_are_named(tmp_path):
    run = _job_run(tmp_path)
    _phase(tmp_path, 0, "init")
    run.watch.go_at -= 21
    assert run.stop_reason()
    assert "local rank 1 not started (not started 20s after the go)" in run._own_cause().summary
