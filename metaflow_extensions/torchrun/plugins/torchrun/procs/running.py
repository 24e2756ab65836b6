"""The ranks of ``@torchrun`` steps running on this host, for ``torchrun ps``: a rank
forked from a warm process is not below its task, so its status file says whose it is.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from ..host.workdirs import work_root
from ..host import proctree, title
from .status import RankStatus, read_statuses

# A recorded pid is the rank's while its process started before the status (whole seconds).
_START_SLACK = 2.0


@dataclass(frozen=True)
class RunningRank:
    run_id: str
    step: str
    task_id: str
    node: int  # torch's group rank: the node's index in the gang
    rank: int
    local_rank: int
    pid: int
    command: str  # as ps -o args shows it

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def running_ranks(flow_file: Optional[str] = None, base: Optional[str] = None) -> List[RunningRank]:
    try:
        root = work_root(base)
        names = os.listdir(root)
    except OSError:
        return []
    found = []
    for name in names:
        task_pid = name.split("-", 1)[0]
        task = _task(int(task_pid), flow_file) if task_pid.isdigit() else None
        if task is None:
            continue
        for status in read_statuses(os.path.join(root, name)).values():
            command = _live_command(status)
            if command is not None:
                found.append(RunningRank(task["run"], task["step"], task["task"], status.group_rank, status.rank,
                                         status.local_rank, status.pid, command))
    return sorted(found, key=lambda r: (r.run_id, r.step, r.node, r.rank))


def _live_command(status: RankStatus) -> Optional[str]:
    if status.end is not None or status.pid <= 0 or status.start is None:
        return None
    started = proctree.started_at(status.pid)
    if started is None or started > status.start + _START_SLACK:
        return None  # gone, or another process has its pid since
    return title.command_line(status.pid)


def _task(pid: int, flow_file: Optional[str]) -> Optional[Dict[str, str]]:
    """Run, step and task id of the Metaflow task ``pid`` running ``flow_file``; else None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        return None
    if "step" not in argv:
        return None
    at = argv.index("step")
    if flow_file is not None and not any(_same_file(os.path.join(cwd, a), flow_file) for a in argv[1:at]):
        return None
    return {"step": _after(argv, "step"), "run": _after(argv, "--run-id"), "task": _after(argv, "--task-id")}


def _after(argv: List[str], flag: str) -> str:
    at = argv.index(flag) if flag in argv else -1
    return argv[at + 1] if 0 <= at < len(argv) - 1 else "?"


def _same_file(path: str, other: str) -> bool:
    try:
        return path.endswith(".py") and os.path.samefile(path, other)
    except OSError:
        return False
