"""Preflight on each node, on the gang join's thread: the software fingerprint and the fitness checks,
from files and the kernel in milliseconds (no torch import); the control compares them (``gang/node_compare.py``)."""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..gang import messages as msg
from ..host.devices import cuda_devices
from .resources import Accelerators
from .torch_checks import _torch_version

# Test-only: METAFLOW_TORCHRUN_FAKE_FINGERPRINT_<FIELD> replaces a field of the fingerprint: "2.12.0" on every
# node, or "1=2.12.0" (node=value pairs, comma-separated) on those named; never set it in a real run.
FAKE_FINGERPRINT_ENV = "METAFLOW_TORCHRUN_FAKE_FINGERPRINT_"
SHM_PATH_ENV = "METAFLOW_TORCHRUN_PREFLIGHT_SHM_PATH"  # test-only: /dev/shm's size read from this path instead
SHM_PATH = "/dev/shm"
# Warned under, per process: NCCL between processes of one node and DataLoader(num_workers>0) live there.
SHM_PER_PROCESS = 1 << 30
MIN_FREE_DISK = 1 << 30  # warned under, where the call's work and log files go
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
CUDNN_PACKAGES = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11")
SHM_FIX = ("raise it with @kubernetes(shared_memory=<MiB>) or @batch(shared_memory=<MiB>), "
           "e.g. shared_memory=%d for %d process%s")


def installed(paths: Sequence[str]) -> Tuple[Dict[str, str], Optional[str]]:
    """(distribution -> version, torch's directory) from the ``*.dist-info`` names on ``paths``: one
    ``listdir`` each, where ``importlib.metadata`` parsed every METADATA file (tens of milliseconds)."""
    versions: Dict[str, str] = {}
    torch_dir: Optional[str] = None
    for directory in paths:
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, version = name[:-len(".dist-info")].partition("-")
                versions.setdefault(_normal(dist), version)
            elif name == "torch" and torch_dir is None and os.path.isfile(os.path.join(directory, name, "version.py")):
                torch_dir = os.path.join(directory, name)
    return versions, torch_dir


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _first(versions: Mapping[str, str], names: Sequence[str]) -> str:
    return next((versions[_normal(n)] for n in names if _normal(n) in versions), "none")


def _torch_cuda(location: Optional[str]) -> str:
    """``cuda = '12.8'`` in torch/version.py (None on a CPU build)."""
    if not location:
        return "none"
    try:
        with open(os.path.join(location, "version.py"), encoding="utf-8") as f:
            match = re.search(r"""^cuda\b[^=]*=\s*['"]([^'"]+)['"]""", f.read(), re.M)
    except OSError:
        return "none"
    return match.group(1) if match else "none"


def fingerprint(env: Mapping[str, str], node_index: int, paths: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """This node's software, field by field (``messages.FINGERPRINT_FIELDS``)."""
    versions, torch_dir = installed(sys.path if paths is None else paths)
    torch = _first(versions, ("torch",))
    if torch == "none" and torch_dir is not None:
        torch = _torch_version(torch_dir) or "unknown"
    found = {
        "python": platform.python_version(),
        "torch": torch,
        "cuda": _torch_cuda(torch_dir),
        "nccl": _first(versions, NCCL_PACKAGES),
        "cudnn": _first(versions, CUDNN_PACKAGES),
        "metaflow": _first(versions, ("metaflow",)),
        "metaflow_torchrun": _first(versions, ("metaflow-torchrun",)),
        "kernel": platform.release() or "unknown",
    }
    return with_fakes(found, env, node_index)


def with_fakes(versions: Dict[str, str], env: Mapping[str, str], node_index: int) -> Dict[str, str]:
    """With the test-only ``FAKE_FINGERPRINT_ENV`` overrides."""
    out = dict(versions)
    for name in msg.FINGERPRINT_FIELDS:
        raw = env.get(FAKE_FINGERPRINT_ENV + name.upper())
        if not raw:
            continue
        if "=" not in raw:
            out[name] = raw[:msg.FINGERPRINT_VALUE_CHARS]
            continue
        for pair in raw.split(","):
            node, _, value = pair.partition("=")
            if node.strip() == str(node_index):
                out[name] = value.strip()[:msg.FINGERPRINT_VALUE_CHARS]
    return out


def mib(n: float) -> str:
    return "%.0f GiB" % (n / (1 << 30)) if n >= 10 << 30 else "%.0f MiB" % (n / (1 << 20))


def shm_check(total: Optional[int], nproc: int) -> msg.PreflightCheck:
    """/dev/shm against the node's processes (``SHM_PER_PROCESS`` each)."""
    want = SHM_PER_PROCESS * max(1, nproc)
    expected = "at least %s (1 GiB per process, %d process%s)" % (mib(want), nproc, "" if nproc == 1 else "es")
    if total is None:
        return msg.PreflightCheck("shm", "ok", "not found", expected)
    if total >= want:
        return msg.PreflightCheck("shm", "ok", mib(total), expected)
    wanted_mib = want >> 20
    return msg.PreflightCheck("shm", "warn", mib(total), expected,
                              SHM_FIX % (wanted_mib, nproc, "" if nproc == 1 else "es"))


def disk_check(free: Optional[int], where: str) -> msg.PreflightCheck:
    expected = "at least %s free in %s" % (mib(MIN_FREE_DISK), where)
    if free is None or free >= MIN_FREE_DISK:
        return msg.PreflightCheck("disk", "ok", "%s free" % mib(free) if free is not None else "unknown", expected)
    return msg.PreflightCheck("disk", "warn", "%s free" % mib(free), expected,
                              "free space on the node, or point TMPDIR at a larger disk")


def gpu_check(nproc: int, accelerators: Accelerators, visible: Optional[int]) -> Optional[msg.PreflightCheck]:
    """Visible GPUs against the processes (None where the step asked for none): named for the whole gang
    before anything starts (the call refuses too few on its own, ``resources.check_visible_devices``)."""
    if accelerators.kind != "gpu":
        return None
    expected = "at least %d (%s)" % (nproc, accelerators.source)
    if visible is None:
        return msg.PreflightCheck("gpus", "ok", "unknown (no driver files)", expected)
    if visible == 0:
        return msg.PreflightCheck("gpus", "warn", "0 visible", expected,
                                  "run on a GPU node; without one the step runs on CPU (gloo)")
    if visible < nproc:
        return msg.PreflightCheck("gpus", "fail", "%d visible" % visible, expected,
                                  "ask for at most %d processes, or for more GPUs" % visible)
    return msg.PreflightCheck("gpus", "ok", "%d visible" % visible, expected)


def nccl_interface(found: Sequence[Tuple[str, str]]) -> Optional[Tuple[str, str]]:
    """The interface NCCL's socket transport likely picks without NCCL_SOCKET_IFNAME: an InfiniBand one
    (``ib*``), else the first not docker, loopback or virbr, in the kernel's order."""
    return (next((f for f in found if f[0].startswith("ib")), None)
            or next((f for f in found if not f[0].startswith(("docker", "lo", "virbr"))), None)
            or (found[0] if found else None))


def network_check(local_addr: str, iface: Optional[str], found: Sequence[Tuple[str, str]],
                  accelerators: Accelerators, env: Mapping[str, str]) -> msg.PreflightCheck:
    """The routable address's interface; with GPUs, NCCL's likely pick. The user's setting is said, not overridden."""
    here = "%s on %s" % (local_addr, iface or "?")
    user = {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if env.get(k)}
    if user:
        return msg.PreflightCheck("network", "ok", "%s; set by you: %s" % (
            here, ", ".join("%s=%s" % kv for kv in sorted(user.items()))), "")
    if accelerators.kind != "gpu":
        return msg.PreflightCheck("network", "ok", here, "")
    pick = nccl_interface(found)
    if pick is None:
        return msg.PreflightCheck("network", "ok", here + "; NCCL's pick unknown", "")
    text = "%s; NCCL would likely pick %s (%s)" % (here, pick[0], pick[1])
    link_local = pick[0].startswith("ecs-") or pick[1].startswith("169.254.")
    if link_local and env.get("AWS_BATCH_JOB_ID"):
        return msg.PreflightCheck(
            "network", "warn", text, "NCCL on the routable interface %s" % (iface or "?"),
            "set NCCL_SOCKET_IFNAME=%s (e.g. @environment(vars={\"NCCL_SOCKET_IFNAME\": \"%s\"})): "
            "AWS Batch's link-local ecs-* interface refuses NCCL's connections (NVIDIA/nccl#859)"
            % (iface or "eth0", iface or "eth0"))
    return msg.PreflightCheck("network", "ok", text, "")


def statvfs_bytes(path: str) -> Tuple[Optional[int], Optional[int]]:
    """(size, free to this user) of the file system holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def existing(path: str) -> str:
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"


def measure(node_index: int, nproc: int, accelerators: Accelerators, env: Mapping[str, str], work_dir: str,
            local_addr: str, iface: Optional[str], found: Sequence[Tuple[str, str]]) -> msg.Preflight:
    """This node's preflight message."""
    shm_total, _ = statvfs_bytes(env.get(SHM_PATH_ENV) or SHM_PATH)
    _, free = statvfs_bytes(existing(work_dir))
    gpus = gpu_check(nproc, accelerators, cuda_devices(env))
    checks = (shm_check(shm_total, nproc), disk_check(free, work_dir), gpus,
              network_check(local_addr, iface, found, accelerators, env))
    return msg.Preflight(versions=fingerprint(env, node_index), checks=tuple(c for c in checks if c is not None))


def default_nproc(nproc_per_node: object, derived: Optional[int]) -> int:
    """The node's processes as known before a call: a count given, the GPUs asked for, else 1 (for "auto" too)."""
    if isinstance(nproc_per_node, int) and not isinstance(nproc_per_node, bool):
        return nproc_per_node
    if isinstance(nproc_per_node, str) and nproc_per_node.isdigit():
        return int(nproc_per_node)
    return derived or 1


