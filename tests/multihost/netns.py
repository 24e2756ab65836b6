"""Several "hosts" on this machine, each with its own IP address, host name and
/etc/hosts: Linux network namespaces joined by a bridge.

Layout of one network (``N`` hosts)::

    namespace <prefix>sw      bridge br0, one veth port per host (h0, h1, ...)
    namespace <prefix>h<i>    lo, and eth0 = 10.231.0.<i+2>/24, the peer of port h<i>

Nothing is created in the machine's own (root) namespace: no interface, no
address, no route. The hosts can reach each other and nothing else, and deleting
the namespaces removes every interface with them.

A process runs in a host through ``ip netns exec <ns> unshare --uts --mount``: its
own host name, and /etc/hosts, /etc/nsswitch.conf (``hosts: files``) and
/etc/resolv.conf bind-mounted from a directory of the harness. Name resolution
therefore never leaves the machine (no DNS server is ever asked), and the harness
decides what resolves when by rewriting a host's hosts file in place (the bind
mount follows the file's inode), e.g. a Kubernetes service name that appears only
after the control pod is up.

Namespace names carry the pid of the process that created them, so a later run
removes the leftovers of a crashed one (``remove_stale``) without touching those
of a run still in progress.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

PREFIX = "mftr"
SUBNET = "10.231.0"
# A locally administered unicast address no host of a network has (theirs are
# the kernel's random veth addresses, also locally administered: a clash would
# need all 46 random bits to match).
NOBODY_MAC = "02:00:5e:00:de:ad"
_NAME = re.compile(r"^%s(\d+)x(\d+)(sw|h\d+|probe)$" % PREFIX)
_counter = [0]
_live: set = set()  # namespaces this process created and has not deleted yet

# Runs as `sh -c SCRIPT sh <etc dir> <hostname> <argv...>` inside the new UTS and
# mount namespaces. unshare(1) makes the mount namespace private by default, so
# the bind mounts are seen by this process tree only.
_ENTER = (
    'd="$1"; h="$2"; shift 2; '
    'mount --bind "$d/hosts" /etc/hosts && '
    'mount --bind "$d/nsswitch.conf" /etc/nsswitch.conf && '
    'mount --bind "$d/resolv.conf" /etc/resolv.conf && '
    'hostname "$h" && exec "$@"'
)


class NetnsUnavailable(Exception):
    """Network namespaces cannot be created here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), (proc.stderr or proc.stdout).strip()))
    return proc


def list_netns() -> List[str]:
    proc = _ip("netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_pids(name: str) -> List[int]:
    proc = _ip("netns", "pids", name, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def kill_netns(name: str) -> None:
    """SIGKILL every process in the namespace: a host pulled whole, its kernel closing every socket."""
    for pid in netns_pids(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _delete_netns(name: str) -> None:
    kill_netns(name)
    _ip("netns", "delete", name, check=False)


def remove_stale() -> List[str]:
    """Delete namespaces (and SIGKILL the processes left in them) that an earlier
    harness process created and did not clean up because it died."""
    removed = []
    for name in list_netns():
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _delete_netns(name)
            removed.append(name)
    return removed


def check_support() -> None:
    """Raise ``NetnsUnavailable`` with the reason when this machine cannot host
    the multi-host tests."""
    if os.geteuid() != 0:
        raise NetnsUnavailable(
            "creating network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); "
            "running as uid %d" % os.geteuid()
        )
    for tool in ("ip", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            raise NetnsUnavailable("`%s` is not installed (iproute2 / util-linux)" % tool)
    name = "%s%dx%dprobe" % (PREFIX, os.getpid(), _next_id())
    try:
        steps = [
            ("netns", "add", name),
            ("-n", name, "link", "add", "br0", "type", "bridge"),
            ("-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1"),
            ("-n", name, "link", "set", "p0", "master", "br0"),
        ]
        for args in steps:
            proc = _ip(*args, check=False)
            if proc.returncode != 0:
                raise NetnsUnavailable(
                    "`ip %s` failed: %s" % (" ".join(args), (proc.stderr or proc.stdout).strip())
                )
        probe = subprocess.run(
            ["ip", "netns", "exec", name, "unshare", "--uts", "--mount", "true"],
            capture_output=True, text=True, timeout=30,
        )
        if probe.returncode != 0:
            raise NetnsUnavailable("`unshare --uts --mount` failed: %s" % probe.stderr.strip())
    finally:
        if name in list_netns():
            _delete_netns(name)


def _next_id() -> int:
    _counter[0] += 1
    return _counter[0]


@dataclass
class Host:
    index: int
    netns: str
    ip: str
    hostname: str
    etc: str  # directory with this host's hosts, nsswitch.conf, resolv.conf
    port: str  # the bridge port (veth end in the switch namespace)
    switch: str
    aliases: List[str] = field(default_factory=list)  # other names of this host
    known: List[Tuple[str, List[str]]] = field(default_factory=list)  # other entries

    def write_hosts(self) -> None:
        """(Re)write this host's /etc/hosts in place: localhost, itself, and
        ``known``. In place, so the bind mount in running processes sees it.
        Written over, then cut to its length: never empty while a process of
        the host reads it (truncated first, a control resolving its own name as
        the names of the others were published found nothing: Metaflow's "Failed
        to get host by name for MF_MASTER_ADDR"). ``known`` only grows, so what
        a reader sees is the old file or the new one, less some of its last line."""
        own = list(dict.fromkeys(self.aliases + [self.hostname]))
        lines = ["127.0.0.1\tlocalhost", "%s\t%s" % (self.ip, " ".join(own))]
        lines += ["%s\t%s" % (ip, " ".join(names)) for ip, names in self.known]
        data = ("\n".join(lines) + "\n").encode()
        path = os.path.join(self.etc, "hosts")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def learn(self, entries: Iterable[Tuple[str, Sequence[str]]]) -> None:
        """Make other hosts' names resolvable here (think: DNS records appear)."""
        for ip, names in entries:
            self.known.append((ip, list(names)))
        self.write_hosts()

    def argv(self, command: Sequence[str]) -> List[str]:
        return [
            "ip", "netns", "exec", self.netns,
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _ENTER, "sh", self.etc, self.hostname, *command,
        ]

    def popen(self, command: Sequence[str], env: Dict[str, str], log: str, cwd: Optional[str] = None,
              stdin=subprocess.DEVNULL) -> subprocess.Popen:
        """Start ``command`` in this host; stdout and stderr go to the file ``log``."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                self.argv(command), env=env, cwd=cwd, stdin=stdin, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )

    def run(self, command: Sequence[str], env: Dict[str, str], timeout: float = 60,
            cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(command), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout,
        )

    def cut_link(self) -> None:
        """Pull the cable: the bridge port of this host goes down. Packets to and
        from the host are dropped from now on; nothing tells its peers."""
        _ip("-n", self.switch, "link", "set", self.port, "down")

    def restore_link(self) -> None:
        _ip("-n", self.switch, "link", "set", self.port, "up")

    def drop_to(self, other: "Host") -> None:
        """One-way loss: this host's packets for ``other`` go to a MAC address
        nobody owns (a permanent neighbour entry), so ``other`` never gets them,
        while ``other``'s packets still arrive here. No kernel module needed
        (there may be no ``sch_netem``)."""
        _ip("-n", self.netns, "neigh", "replace", other.ip, "lladdr", NOBODY_MAC, "dev", "eth0", "nud", "permanent")

    def undo_drop_to(self, other: "Host") -> None:
        _ip("-n", self.netns, "neigh", "del", other.ip, "dev", "eth0", check=False)

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` runs in this host (its network namespace)."""
        try:
            return os.stat("/proc/%d/ns/net" % pid).st_ino == os.stat("/run/netns/" + self.netns).st_ino
        except OSError:
            return False


class Network:
    """``num_hosts`` hosts on one bridge. Use as a context manager, or call
    ``close()``: it deletes every namespace it created (processes still inside
    are SIGKILLed first)."""

    def __init__(self, num_hosts: int, workdir: str, hostnames: Optional[Sequence[str]] = None):
        if num_hosts < 1 or num_hosts > 200:
            raise ValueError("num_hosts must be 1..200")
        self.id = "%s%dx%d" % (PREFIX, os.getpid(), _next_id())
        self.switch = self.id + "sw"
        self.workdir = workdir
        self.hosts: List[Host] = []
        self._created: List[str] = []
        names = list(hostnames or ["host%d" % i for i in range(num_hosts)])
        try:
            self._create(num_hosts, names)
        except BaseException:
            self.close()
            raise

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _live.add(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _create(self, num_hosts: int, names: List[str]) -> None:
        self._add_netns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(num_hosts):
            ns = "%sh%d" % (self.id, i)
            self._add_netns(ns)
            port = "h%d" % i
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            ip = "%s.%d" % (SUBNET, i + 2)
            _ip("-n", ns, "addr", "add", ip + "/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            etc = os.path.join(self.workdir, "etc-%s" % ns)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "nsswitch.conf"), "w") as f:
                f.write("passwd: files\ngroup: files\nhosts: files\n")
            with open(os.path.join(etc, "resolv.conf"), "w") as f:
                f.write("# no DNS in the multi-host harness: names come from /etc/hosts\n")
            host = Host(index=i, netns=ns, ip=ip, hostname=names[i], etc=etc, port=port, switch=self.switch)
            host.write_hosts()
            self.hosts.append(host)

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self) -> List[int]:
        found: List[int] = []
        for ns in self._created:
            found.extend(netns_pids(ns))
        return found

    def close(self) -> None:
        for ns in reversed(self._created):
            if ns in list_netns():
                _delete_netns(ns)
            _live.discard(ns)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(ns in list_netns() for ns in self._created):
            time.sleep(0.1)
        self._created = []


@atexit.register
def _delete_live() -> None:
    """Last resort (an interrupted session): delete what this process created."""
    for name in list(_live):
        _delete_netns(name)
        _live.discard(name)
