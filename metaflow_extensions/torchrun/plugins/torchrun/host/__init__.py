"""Host plumbing: this machine's processes, private files, devices, network and
console. The bottom layer: no Metaflow, nothing of the gang.

Usage::

    files = CallFiles(log_key, node_index)       # a call's private directories
    address, iface = route_to(main_addr, is_local)
    say("one line for the user")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.lazy import names_from

__all__ = [
    "rank_output",
    "step_log_dir",
    "CallFiles",
    "StepDir",
    "base_dir",
    "GpuUsage",
    "LogKey",
    "count_with_torch",
    "cuda_devices",
    "die_with_parent",
    "name_this_process",
    "kill_group",
    "signal_main_thread",
    "host_name",
    "interfaces",
    "is_loopback",
    "open_private",
    "route_to",
    "wait_listening",
    "say",
    "say_once",
    "tail_lines",
    "usable_cpus",
    "where_logs_are",
    "work_root",
    "retention_policy",
]

# Where each name lives: loaded on first use, so that importing the face costs nothing.
_HOME = {
    "rank_output": "console",
    "step_log_dir": "logs",
    "CallFiles": "workdirs",
    "StepDir": "workdirs",
    "base_dir": "basedir",
    "GpuUsage": "gpu_usage",
    "LogKey": "logs",
    "count_with_torch": "devices",
    "cuda_devices": "devices",
    "die_with_parent": "proctree",
    "name_this_process": "proctree",
    "kill_group": "proctree",
    "signal_main_thread": "proctree",
    "interfaces": "network",
    "host_name": "network",
    "is_loopback": "network",
    "open_private": "private",
    "route_to": "network",
    "wait_listening": "network",
    "say": "console",
    "say_once": "console",
    "tail_lines": "private",
    "usable_cpus": "devices",
    "where_logs_are": "logs",
    "work_root": "workdirs",
    "retention_policy": "logs",
}

if TYPE_CHECKING:
    from .basedir import base_dir
    from .console import rank_output
    from .logs import step_log_dir
    from .console import say, say_once
    from .devices import count_with_torch, cuda_devices, usable_cpus
    from .gpu_usage import GpuUsage
    from .logs import LogKey, retention_policy, where_logs_are
    from .network import host_name, interfaces, is_loopback, route_to, wait_listening
    from .private import open_private, tail_lines
    from .proctree import die_with_parent, kill_group, name_this_process, signal_main_thread
    from .workdirs import CallFiles, StepDir, work_root


__getattr__ = names_from(__name__, _HOME)
