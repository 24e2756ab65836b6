"""The harness itself: hosts with their own addresses, names and hosts files, a
name that starts resolving while a process runs, a cable that can be pulled, and
a plain two-host torchrun (no Metaflow) across them."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from . import netns

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flows", "scripts")

PROBE = r"""
import json, socket, sys
out = {"hostname": socket.gethostname(), "fqdn": socket.getfqdn()}
try:
    out["self"] = socket.gethostbyname(socket.gethostname())
except OSError as e:
    out["self"] = repr(e)
try:
    socket.gethostbyname("example.com")
    out["dns"] = "resolved"
except OSError:
    out["dns"] = "no"
peer, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((peer, port), timeout=3)
    out["peer"] = s.recv(64).decode()
except OSError as e:
    out["peer"] = repr(e)
print(json.dumps(out))
"""

SERVE = r"""
import socket, sys
addr, port, reply = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(reply.encode()); c.close()
"""


def _serve(host, sandbox, addr, port, reply, name):
    proc = host.popen([sys.executable, "-c", SERVE, addr, str(port), reply], sandbox.env,
                      sandbox.log_path(name))
    deadline = time.monotonic() + 10
    while "listening" not in sandbox.read_log(name):
        assert proc.poll() is None and time.monotonic() < deadline, sandbox.read_log(name)
        time.sleep(0.05)
    return proc


def _probe(host, sandbox, peer, port):
    proc = host.run([sys.executable, "-c", PROBE, peer, str(port)], sandbox.env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hosts_have_their_own_address_name_and_loopback(network, sandbox):
    net = network(2)
    a, b = net.hosts
    a.hostname, b.hostname = "alpha", "bravo"
    a.write_hosts(), b.write_hosts()
    servers = [_serve(b, sandbox, "0.0.0.0", 23001, "bravo-eth0", "srv-b"),
               _serve(b, sandbox, "127.0.0.1", 23002, "bravo-lo", "srv-b-lo")]
    try:
        got = _probe(a, sandbox, b.ip, 23001)
        assert got["hostname"] == "alpha" and got["self"] == a.ip
        assert got["dns"] == "no"  # nothing but the hosts file answers
        assert got["peer"] == "bravo-eth0"
        # 127.0.0.1 is private to each host: bravo's loopback listener is not
        # reachable as 127.0.0.1 from alpha.
        assert "refused" in _probe(a, sandbox, "127.0.0.1", 23002)["peer"].lower()
        # The machine's own hostname and hosts file are untouched.
        assert socket.gethostname() not in ("alpha", "bravo")
        with open("/etc/hosts") as f:
            assert "alpha" not in f.read()
    finally:
        for p in servers:
            p.kill()
            p.wait()


def test_a_name_starts_resolving_while_a_process_waits_for_it(network, sandbox):
    net = network(2)
    a, b = net.hosts
    wait = (
        "import socket, time\n"
        "t0 = time.monotonic()\n"
        "while True:\n"
        "    try:\n"
        "        print(socket.gethostbyname('control.svc.example'), round(time.monotonic() - t0, 1)); break\n"
        "    except OSError:\n"
        "        time.sleep(0.2)\n"
    )
    proc = b.popen([sys.executable, "-c", wait], sandbox.env, sandbox.log_path("waiter"))
    time.sleep(1.5)
    assert proc.poll() is None, sandbox.read_log("waiter")  # not resolvable yet
    b.learn([(a.ip, ["control.svc.example"])])
    assert proc.wait(timeout=10) == 0
    ip, waited = sandbox.read_log("waiter").split()
    assert ip == a.ip and float(waited) >= 1.0


def test_cutting_a_link_silences_the_host(network, sandbox):
    net = network(2)
    a, b = net.hosts
    server = _serve(b, sandbox, "0.0.0.0", 23003, "up", "srv")
    try:
        assert _probe(a, sandbox, b.ip, 23003)["peer"] == "up"
        b.cut_link()
        got = _probe(a, sandbox, b.ip, 23003)["peer"]
        assert "timed out" in got or "unreachable" in got.lower(), got
        b.restore_link()
    finally:
        server.kill()
        server.wait()


@pytest.mark.timeout(150)
def test_plain_torchrun_allreduce_across_two_hosts(network, sandbox):
    """torchrun with c10d rendezvous on host 0 and an explicit --local-addr on
    each host, one process per host, gloo: both ranks see one all-reduce."""
    net = network(2)
    procs = []
    for host in net.hosts:
        host.hostname = "node%d" % host.index
        host.write_hosts()
        env = dict(sandbox.env, METAFLOW_TORCHRUN_NODE_INDEX=str(host.index))
        argv = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "%s:29400" % net.hosts[0].ip,
            "--rdzv-id", "plain", "--rdzv-conf", "is_host=%d" % (host.index == 0),
            "--local-addr", host.ip,
            os.path.join(SCRIPTS, "report.py"),
        ]
        procs.append(host.popen(argv, env, sandbox.log_path("torchrun%d" % host.index), cwd=SCRIPTS))
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "\n".join(sandbox.read_log("torchrun%d" % i)[-3000:] for i in range(2))
    assert codes == [0, 0], logs
    reports = sandbox.reports("rank-")
    assert sorted(reports) == [0, 1], logs
    assert {r["world"] for r in reports.values()} == {2}
    assert {r["sum"] for r in reports.values()} == {0 + 1}
    assert sorted(r["node_index"] for r in reports.values()) == [0, 1]


def test_without_root_the_reason_is_given(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsUnavailable, match="needs root"):
        netns.check_support()


def test_leftovers_of_a_crashed_run_are_removed(network, sandbox):
    """A namespace whose creator died, with a process still inside, is deleted
    and the process killed; a live creator's namespaces are left alone."""
    network(1)  # a live one, ours
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = "%s%dx1sw" % (netns.PREFIX, dead.pid)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        inside = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"], env=sandbox.env)
        deadline = time.monotonic() + 5
        while not netns.netns_pids(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        removed = netns.remove_stale()
        assert name in removed
        assert inside.wait(timeout=10) != 0
        assert name not in netns.list_netns()
        assert all(not ns.startswith("%s%dx" % (netns.PREFIX, os.getpid())) for ns in removed)
    finally:
        if name in netns.list_netns():
            subprocess.run(["ip", "netns", "delete", name])


def test_a_hosts_file_being_rewritten_is_never_read_without_the_hosts_own_name(tmp_path):
    """Rewritten as names are published while the host's processes read it: the control resolving its
    own name then must find it (truncated first, it found an empty file: Metaflow's "Failed to get
    host by name for MF_MASTER_ADDR", once in a CI run). Another process reads it as it is rewritten."""
    host = netns.Host(0, "ns", "10.9.0.2", "control-0", str(tmp_path), "port", "switch", aliases=["control-0.js"])
    host.write_hosts()
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys
        path, stop, missed, reads = sys.argv[1], sys.argv[2], 0, 0
        print("reading", flush=True)
        while not os.path.exists(stop):
            with open(path) as f:
                missed += "control-0.js" not in f.read()
            reads += 1
        print(missed, reads)
    """), str(tmp_path / "hosts"), str(tmp_path / "stop")], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
        began, i = time.monotonic(), 0
        while i < 400 or time.monotonic() - began < 0.5:
            host.learn([("10.9.1.%d" % (i % 250), ["worker-%d.js" % i])])
            i += 1
    finally:
        (tmp_path / "stop").write_text("")
        out, _ = reader.communicate(timeout=30)
    missed, reads = map(int, out.split())
    assert reads > 10 and missed == 0, (missed, reads)
