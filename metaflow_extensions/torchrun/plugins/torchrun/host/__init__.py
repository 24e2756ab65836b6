"""Host plumbing: this machine's processes, private files, devices, network and
console. No Metaflow, nothing of the gang: the ranks import it too.
"""

from __future__ import annotations

from ..base.lazy import names_from

TYPE_CHECKING = False  # typing unimported: a rank's stand-in loads this package (procs/handoff.py)

__all__ = [
    "rank_output", "say", "say_once", "base_dir", "CallFiles", "StepDir", "work_root", "GpuUsage",
    "LogKey", "step_log_dir", "where_logs_are", "retention_policy", "count_with_torch", "cuda_devices",
    "usable_cpus", "die_with_parent", "name_this_process", "kill_group", "signal_main_thread", "host_name",
    "interfaces", "is_loopback", "route_to", "wait_listening", "open_private", "tail_lines",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_MODULES = {
    "console": ("rank_output", "say", "say_once"),
    "basedir": ("base_dir",),
    "workdirs": ("CallFiles", "StepDir", "work_root"),
    "gpu_usage": ("GpuUsage",),
    "logs": ("LogKey", "step_log_dir", "where_logs_are", "retention_policy"),
    "devices": ("count_with_torch", "cuda_devices", "usable_cpus"),
    "proctree": ("die_with_parent", "name_this_process", "kill_group", "signal_main_thread"),
    "network": ("host_name", "interfaces", "is_loopback", "route_to", "wait_listening"),
    "private": ("open_private", "tail_lines"),
}

if TYPE_CHECKING:
    from .basedir import base_dir
    from .console import rank_output, say, say_once
    from .devices import count_with_torch, cuda_devices, usable_cpus
    from .gpu_usage import GpuUsage
    from .logs import LogKey, retention_policy, step_log_dir, where_logs_are
    from .network import host_name, interfaces, is_loopback, route_to, wait_listening
    from .private import open_private, tail_lines
    from .proctree import die_with_parent, kill_group, name_this_process, signal_main_thread
    from .workdirs import CallFiles, StepDir, work_root


__getattr__ = names_from(__name__, {name: module for module, names in _MODULES.items() for name in names})
