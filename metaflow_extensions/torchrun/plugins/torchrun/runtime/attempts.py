"""Every attempt of a step, and whether the next one is worth running.

Metaflow's ``@retry`` reruns the whole gang whatever stopped it. A retried
gang costs its start again (every node's task, ``import torch``, the
rendezvous) and on clusters ``minutes_between_retries``; a ``TypeError`` on
line 1 of the training loop will raise again at the same place, so under
``@torchrun(retry_on="infrastructure")`` the control of attempt k reads why
attempt k-1 stopped (its ``torchrun-result`` record) and refuses to start any
rank when that was the user's own code.

The attempts of a step also make the record's ``attempts`` list: when each
started, how long its gang took to form, when its calls started, why it
stopped, the checkpoint it resumed from, and what each failure cost.

Pure functions over plain dicts (the record as stored), except
``read_previous``, which asks the Metaflow client.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..cause import CauseKind

RETRY_ON = ("any", "infrastructure")
# "any" keeps Metaflow's @retry as it is: see docs/resume.md for why.
DEFAULT_RETRY_ON = "any"

# Kinds of a gang's stop that the user's code raised.
_CODE_KINDS = (CauseKind.RANK_FAILED, CauseKind.STEP_FAILED, CauseKind.CALL_MISMATCH)
# Exceptions that are the world's, not the code's: a peer or the network gone,
# torch's store or a collective timing out, the task told to stop.
_INFRA_TYPES = frozenset((
    "DistBackendError", "DistNetworkError", "DistStoreError", "DistError",
    "GangAborted", "TorchrunInterrupted", "KeyboardInterrupt", "SystemExit",
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "BrokenPipeError",
))
_INFRA_TEXT = re.compile(
    r"NCCL|gloo|Connection (closed|reset|refused)|Broken pipe|ECC error|uncorrectable|Xid|"
    r"collective operation timeout|Watchdog caught", re.I)
# Frames of the launcher, Metaflow, installed packages and the standard
# library are not "your code": the place named is the user's last frame.
_NOT_USER = re.compile(r"site-packages|dist-packages|/metaflow_extensions/|/metaflow/|/lib/python3\.\d+/")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def validate_retry_on(value: Any) -> str:
    from ..errors import TorchrunInvalidArgument

    if value is None:
        return DEFAULT_RETRY_ON
    if not isinstance(value, str) or value not in RETRY_ON:
        raise TorchrunInvalidArgument(
            "@torchrun(retry_on=%r): takes %s." % (value, " or ".join(repr(v) for v in RETRY_ON)))
    return value


def place(traceback: Optional[str]) -> Optional[str]:
    """``train.py:88``: the innermost frame of the user's code in a
    traceback, or the innermost frame when none is the user's."""
    frames = _FRAME.findall(traceback or "")
    if not frames:
        return None
    mine = [f for f in frames if not _NOT_USER.search(f[0])]
    path, line = (mine or frames)[-1]
    return "%s:%s" % (os.path.basename(path), line)


def kind_of(cause: Any) -> Optional[CauseKind]:
    """The kind of a cause as the record holds it (its wire form), or None."""
    try:
        return CauseKind(cause.get("kind")) if isinstance(cause, Mapping) else None
    except ValueError:
        return None


def user_code_failure(cause: Optional[Mapping[str, Any]]) -> Optional[str]:
    """``ValueError at train.py:88`` when the cause is a Python exception the
    user's code raised (in a rank, or in the step's own code); None for
    everything else: a node lost, frozen or preempted, a signal, a NCCL/gloo
    error, a stop asked for, a hang, an exit without a Python exception."""
    kind = kind_of(cause)
    if kind not in _CODE_KINDS or not isinstance(cause, Mapping):
        return None
    if cause.get("secondary") is True:
        return None
    if kind is CauseKind.CALL_MISMATCH:
        return "a mismatch of current.torch.run calls between nodes"
    exc_type = cause.get("exc_type")
    if not isinstance(exc_type, str) or not exc_type or exc_type.split(".")[-1] in _INFRA_TYPES:
        return None
    text = "%s\n%s" % (cause.get("message") or "", cause.get("summary") or "")
    if _INFRA_TEXT.search(text):
        return None
    where = place(cause.get("traceback") if isinstance(cause.get("traceback"), str) else None)
    return "%s at %s" % (exc_type, where) if where else exc_type


def refusal(retry_on: str, attempt: int, previous: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The one line that refuses attempt ``attempt``, or None to run it."""
    if retry_on != "infrastructure" or attempt <= 0 or not isinstance(previous, Mapping):
        return None
    what = user_code_failure(previous.get("cause"))
    if what is None:
        return None
    origin = previous_origin(previous, attempt - 1)
    return ("not retried: attempt %d failed in your code, %s; @torchrun(retry_on='infrastructure') "
            "retries only infrastructure failures" % (origin, what))


def previous_origin(previous: Mapping[str, Any], default: int) -> int:
    """The attempt whose failure a refused attempt carried forward."""
    history = previous.get("attempts")
    if isinstance(history, list) and history and isinstance(history[-1], Mapping):
        carried = history[-1].get("refused_for")
        if isinstance(carried, int) and not isinstance(carried, bool):
            return carried
    return default


def history(previous: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The attempts before this one, from the previous attempt's record."""
    if not isinstance(previous, Mapping) or not isinstance(previous.get("attempts"), list):
        return []
    return [dict(a) for a in previous["attempts"] if isinstance(a, Mapping)][:64]


def fill_missing(past: List[Dict[str, Any]], attempt: int) -> List[Dict[str, Any]]:
    """Attempts 0..attempt-1, each once: an attempt whose control task died
    before writing its record is named as unknown rather than left out."""
    by_attempt = {a.get("attempt"): a for a in past}
    return [by_attempt.get(k) or {"attempt": k, "stopped": "unknown: its control task left no record "
                                  "(killed before the end of its step?)"} for k in range(attempt)]


def checkpoint_info(current: Any) -> Optional[Dict[str, Any]]:
    """The checkpoint ``@checkpoint`` loaded for this attempt, if any."""
    ckpt = getattr(current, "checkpoint", None) if current is not None else None
    try:
        if ckpt is None or not ckpt.is_loaded:
            return None
        info = ckpt.info
        meta = getattr(info, "metadata", None)
        return {
            "key": str(getattr(info, "key", "")),
            "pathspec": getattr(info, "pathspec", None),
            "attempt": getattr(info, "attempt", None),
            "created_on": getattr(info, "created_on", None),
            "created_at": _epoch(getattr(info, "created_on", None)),
            "metadata": dict(meta) if isinstance(meta, Mapping) else None,
        }
    except Exception:  # a checkpoint package we do not know: no resume shown
        return None


def _epoch(stamp: Any) -> Optional[float]:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def this_attempt(
    attempt: int, started_at: float, results: List[Any], cause: Optional[Mapping[str, Any]],
    resumed_from: Optional[Dict[str, Any]], refused_for: Optional[int] = None,
    code_started_at: Optional[float] = None,
) -> Dict[str, Any]:
    """One entry of ``attempts``, from this attempt's calls on the control."""
    joined: List[float] = []
    for r in results[:1]:
        joined = [float(t) for t in (r.gang.get("joined_at") or {}).values() if isinstance(t, (int, float))]
    ended = max([r.ended_at for r in results] or [started_at])
    stopped = (cause or {}).get("summary") if cause else ("refused" if refused_for is not None else "succeeded")
    return {
        "attempt": attempt,
        "started_at": started_at,
        # The step's code began: every decorator's task_pre_step done
        # (@checkpoint's load among them), the local nodes started.
        "code_started_at": code_started_at,
        "gang_formed_at": max(joined) if joined else None,
        "gang_formed_seconds": (max(joined) - started_at) if joined else None,
        "calls": [{"call": r.call, "started_at": r.started_at} for r in results],
        "ended_at": (cause or {}).get("time") or ended,
        "stopped": stopped,
        "kind": (cause or {}).get("kind"),
        "resumed_from": resumed_from,
        "refused_for": refused_for,
    }


def with_costs(attempts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """What each failure cost: the work since the last checkpoint before it
    (the one the next attempt resumed from; the whole attempt without one)
    and the restart (the failure to the next attempt's first call with its
    whole gang there: the later of the call's start and the gang formed)."""
    out = [dict(a) for a in attempts]
    for failed, nxt in zip(out, out[1:]):
        end = _num(failed.get("ended_at"))
        if end is None:
            continue
        resumed = nxt.get("resumed_from") or {}
        saved = _num(resumed.get("created_at")) if isinstance(resumed, Mapping) else None
        calls = failed.get("calls") or []
        began = _num(calls[0].get("started_at")) if calls else _num(failed.get("started_at"))
        since = saved if saved is not None and saved <= end else began
        nxt_calls = nxt.get("calls") or []
        restart_to = _num(nxt_calls[0].get("started_at")) if nxt_calls else None
        formed = _num(nxt.get("gang_formed_at"))
        if restart_to is not None and formed is not None:
            restart_to = max(restart_to, formed)
        failed["lost_work_seconds"] = max(0.0, end - since) if since is not None else None
        failed["restart_seconds"] = max(0.0, restart_to - end) if restart_to is not None else None
        parts = [failed["lost_work_seconds"], failed["restart_seconds"]]
        failed["lost_seconds"] = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    return out


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_previous(pathspec: str, attempt: int, field: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """Attempt ``attempt``'s record of this task through the Metaflow client,
    and a note when it could not be read (None, None: it left none, as a task
    killed before its end leaves none)."""
    import json

    try:
        from metaflow import Task

        task = Task(pathspec, attempt=attempt, _namespace_check=False)
        values = [m for m in task.metadata if m.name == field]
    except Exception as e:  # the record helps; it must never stop the step
        return None, "could not read attempt %d's record (%s)" % (attempt, e)
    if not values:
        return None, None
    latest = sorted(values, key=lambda m: m.created_at or 0)[-1]
    try:
        record = json.loads(latest.value)
    except (TypeError, ValueError):
        return None, "attempt %d's record is not JSON" % attempt
    return (record, None) if isinstance(record, dict) else (None, "attempt %d's record is not an object" % attempt)
