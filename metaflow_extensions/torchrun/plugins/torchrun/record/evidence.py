"""One evidence bundle per failed attempt (the artifact ``torchrun_evidence``),
where the next attempt and anyone with the client can compare it: the cause,
the stacks grouped by place, every rank's last lines, the host's NCCL Flight
Recorder dumps; the node a failure names adds its ``nvidia-smi -q`` in its own
task. Only a failed task keeps one, and a failed task reaches no join: no join
meets two values. Bounded at any gang size (``MAX_BYTES``).
"""

from __future__ import annotations

import base64
import glob
import os
import shutil
import subprocess
from typing import Any, Dict, List, Mapping, Optional

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow import Task

from ..procs.ranges import numbers
from ..procs.stacks import SUMMARY_PLACES, group
from ..procs import names

ARTIFACT = "torchrun_evidence"
# The whole bundle, at most (JSON characters), and its parts' shares.
MAX_BYTES = 4 << 20
STACK_CHARS = 16 << 10
TAIL_LINES = 5
TAIL_LINE_CHARS = 300
TAIL_BYTES = 2 << 20
# Flight Recorder dumps, under the prefix either of torch's names gives (2.15's
# and the older one; torch's default when neither is set): at most this many,
# each cut to this many bytes (base64 in the bundle).
FLIGHT_ENVS = (names.FR_DUMP_ENV, names.FR_DUMP_OLD_ENV)
FLIGHT_DEFAULT = "/tmp/nccl_trace_rank_"
MAX_DUMPS = 8
DUMP_BYTES = 128 << 10
SMI_CHARS = 64 << 10
SMI_TIMEOUT = 10.0


def stacks_part(stacks: Mapping[int, str]) -> List[Dict[str, Any]]:
    """Ranks grouped by where they were, odd ones out first; one stack each."""
    return [{"ranks": numbers(ranks), "count": len(ranks), "place": list(place), "example_rank": ranks[0],
             "stack": stacks[ranks[0]][:STACK_CHARS]} for place, ranks in group(stacks)[:SUMMARY_PLACES]]


def tails_part(reports: Mapping[int, Any], budget: int = TAIL_BYTES) -> Dict[str, Any]:
    """rank -> stream -> its last lines, every rank of every node, until the budget is spent."""
    out: Dict[str, Any] = {}
    used, left_out = 0, 0
    for node in sorted(reports):
        for rank, streams in sorted(getattr(reports[node], "tails", {}).items()):
            kept = {s: [line[:TAIL_LINE_CHARS] for line in list(lines)[-TAIL_LINES:]] for s, lines in streams.items()}
            size = sum(len(line) + 4 for lines in kept.values() for line in lines) + 16
            if used + size > budget:
                left_out += 1
                continue
            used += size
            out[str(rank)] = dict(kept, node=node)
    return {"ranks": out, "left_out": left_out}


def flight_recorder(env: Mapping[str, str]) -> Dict[str, Any]:
    """NCCL's Flight Recorder dumps on this host, under either of torch's names, cut and counted."""
    prefixes = list(dict.fromkeys(env[name] for name in FLIGHT_ENVS if env.get(name))) or [FLIGHT_DEFAULT]
    paths = sorted({p for prefix in prefixes for p in glob.glob(glob.escape(prefix) + "*")})
    dumps = []
    for path in paths[:MAX_DUMPS]:
        try:
            with open(path, "rb") as f:
                data = f.read(DUMP_BYTES + 1)
        except OSError:
            continue
        dumps.append({"file": path, "bytes": os.path.getsize(path), "cut": len(data) > DUMP_BYTES,
                      "base64": base64.b64encode(data[:DUMP_BYTES]).decode("ascii")})
    return {"prefixes": prefixes, "dumps": dumps, "left_out": max(0, len(paths) - MAX_DUMPS)}


def nvidia_smi() -> Optional[str]:
    """``nvidia-smi -q`` of this node, where the tool exists (None otherwise)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        proc = subprocess.run([tool, "-q"], capture_output=True, text=True, timeout=SMI_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        return "nvidia-smi -q failed: %s" % e
    return (proc.stdout or proc.stderr)[:SMI_CHARS]


def bundle(result: Any, is_control: bool, node: int, attempt: int, env: Mapping[str, str]) -> Optional[Dict[str, Any]]:
    """This task's bundle when the attempt failed; None when it succeeded or this node adds nothing."""
    cause = getattr(result, "cause", None)
    if cause is None or not is_control and cause.node_index != node:
        return None
    if not is_control:
        return {"attempt": attempt, "node": node, "nvidia_smi": nvidia_smi()}
    out = {"attempt": attempt, "cause": cause.to_wire(), "stacks": stacks_part(result.stacks),
           "tails": tails_part(result.gang.reports), "flight_recorder": flight_recorder(env)}
    if cause.node_index == node:
        out["nvidia_smi"] = nvidia_smi()
    return out


def read(pathspec: str, attempt: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """The client helper: a task's bundle of ``attempt`` (None: its latest), or None."""
    task = Task(pathspec, attempt=attempt, _namespace_check=False)
    return task[ARTIFACT].data if ARTIFACT in task else None
