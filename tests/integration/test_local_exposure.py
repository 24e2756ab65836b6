"""On a local run nothing of the job is reachable off loopback, and nothing a
stranger writes into torch's store is unpickled.

The probe is what another user of the host could do: connect to every port the
job's processes listen on, through an address other than 127.0.0.1, and write a
pickle into the rendezvous store under every key an agent might read back.
"""

from __future__ import annotations

import base64
import datetime
import os
import pickle
import socket
import time

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host.network import local_address_towards

from our_processes import argv, is_torchrun, processes_with_token


def _socket_inodes(pid: int) -> set:
    found = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[8:-1])
    except OSError:
        pass
    return found


def listening_ports(pids) -> dict:
    """port -> local address of every TCP socket in LISTEN that these processes hold."""
    inodes = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:
                    addr, port = local.split(":")
                    ports[int(port, 16)] = addr
    return ports


def accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def off_loopback_addresses() -> list:
    addresses = ["127.0.0.2"]  # loopback's other addresses: refused by a 127.0.0.1 socket
    own = local_address_towards("192.0.2.1")
    if own and not own.startswith("127."):
        addresses.append(own)
    return addresses


def agent_option(pids, name: str) -> str:
    """The value of option ``name`` on the command line of the job's torchrun agent."""
    for pid in filter(is_torchrun, pids):
        args = argv(pid)
        if name in args:
            return args[args.index(name) + 1]
    raise AssertionError("no torchrun process of the job has %s" % name)


class _Planted:
    """Unpickling this creates the marker directory: proof that it was loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def plant_pickle(port: int, rdzv_id: str, marker: str) -> list:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    payload = pickle.dumps(_Planted(marker))
    keys = {"torch.rendezvous." + rdzv_id}
    keys.update(k for k in store.list_keys() if "rendezvous" in k)
    for key in keys:
        # c10d's backend reads its state as base64 of a pickle; the raw pickle too.
        store.set(key, base64.b64encode(payload))
        store.set(key + ".raw", payload)
    return sorted(keys)


@pytest.mark.parametrize("torchrun_args", ["null", '{"max_restarts": 1}'], ids=["static", "restarts"])
def test_local_run_listens_on_loopback_only_and_loads_no_planted_pickle(gang, torchrun_args):
    """Without restarts torch's static rendezvous; with them, c10d's, whose state
    is a pickle: a user of this host who connects to its loopback port can still
    plant one (README, security model), so only the static case is planted."""
    pytest.importorskip("torch.distributed")
    proc = gang.start("--script", "hold.py", "--nodes", "2", "--nproc", "2", "--torchrun-args", torchrun_args)
    marker = os.path.join(gang.tmp, "planted-pickle-ran")
    try:
        gang.wait_for_reports("ready-", 4, timeout=120)
        pids = processes_with_token(gang.token)
        ports = listening_ports(pids)
        # The gang service, torch's store and gloo's sockets at least.
        assert len(ports) >= 3, ports
        store_port = int(agent_option(pids, "--rdzv-endpoint").rsplit(":", 1)[1])
        assert store_port in ports, (store_port, ports)
        exposed = [(a, p) for p in ports for a in off_loopback_addresses() if accepts(a, p)]
        assert not exposed, "reachable off loopback: %s (listening: %s)" % (exposed, ports)
        assert any(accepts("127.0.0.1", p) for p in ports)
        planted = []
        if torchrun_args == "null":
            planted = plant_pickle(store_port, agent_option(pids, "--rdzv-id"), marker)
            time.sleep(7)  # c10d's agents read the state back every 5 s
    finally:
        with open(os.path.join(gang.out, "release"), "w"):
            pass
    out, _ = proc.communicate(timeout=180)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    assert not os.path.exists(marker), "a pickle planted under %s was loaded" % planted
