"""Asking a live rank for its Flight Recorder summary (flight.py), as a hang is stopped.

The dump is a call into torch, which a signal handler cannot make: a daemon
thread blocked in ``open()`` of the rank's FIFO answers, even while the main
thread waits in a collective (torch releases the GIL). Nothing here imports torch.
"""

from __future__ import annotations

import errno
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from .flight import (FAILED, GLOO, NCCL, NO_GROUP, NOTE_CHARS, UNSUPPORTED, FlightError, FlightSummary,
                     summarize)
from .names import FLIGHT_ASK_SUFFIX, FLIGHT_SUFFIX, FR_BUFFER_ENV, FR_BUFFER_OLD_ENV, rank_file
from .records import read_json, write_json

TOKEN_CHARS = 16
# The node's end: never blocks (no reader: ENXIO at once), never follows a link.
_ASK_FLAGS = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)


def ask_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, FLIGHT_ASK_SUFFIX)


def answer_path(directory: str, rank: int) -> str:
    return rank_file(directory, rank, FLIGHT_SUFFIX)


def recording(env: Mapping[str, str]) -> bool:
    """By torch's own reading of its variables: the first set one wins."""
    value = next((env[name] for name in (FR_BUFFER_ENV, FR_BUFFER_OLD_ENV) if name in env), "0")
    try:
        return int(value) > 0
    except ValueError:
        return False


def listen(directory: Optional[str], rank: int) -> Optional[threading.Thread]:
    if not directory or rank < 0:
        return None
    path = ask_path(directory, rank)
    try:
        if os.path.lexists(path):
            os.unlink(path)
        os.mkfifo(path, 0o600)
        thread = threading.Thread(target=_serve, args=(path, answer_path(directory, rank)),
                                  name="torchrun-flight", daemon=True)
        thread.start()
    except (OSError, RuntimeError):
        return None
    return thread


def _serve(path: str, answer: str) -> None:
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # blocks until asked
        except OSError:
            return  # the work directory is gone: the call is over
        try:
            token = os.read(fd, TOKEN_CHARS).decode("ascii", "replace")
        except OSError:
            token = ""
        finally:
            os.close(fd)
        if len(token) != TOKEN_CHARS:
            # Back in open() before the node closed its end: not a question. An
            # answer would overwrite the true one before the node read it.
            continue
        try:
            summary = summary_of(sys.modules.get("torch.distributed"), sys.modules.get("torch._C._distributed_c10d"))
            write_json(answer, {"token": token, "summary": summary.to_wire()})
        except Exception:
            pass  # best effort: the node goes by the stacks then


def summary_of(dist: Any, c10d: Any) -> FlightSummary:
    """The recorder of the default group's backend: gloo's through
    ``_dump_fr_trace_json``, stock NCCL's ``_dump_nccl_trace_json``, another's
    (2.15's nccl2) ``_dump_fr_trace_json(backend=)``. Where this torch lacks
    one: ``UNSUPPORTED``, never another backend's recorder read instead."""
    recorder = GLOO
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return FlightSummary(NO_GROUP)
        recorder = recorder_for(default_backends(dist))
        text, why = dump_recorder(c10d, recorder)
        if text is None:
            return _unsupported(recorder, why)
        return summarize(text, recorder)
    except Exception:
        return FlightSummary(FAILED, recorder=recorder)


def dump_recorder(c10d: Any, recorder: str) -> Tuple[Optional[Any], str]:
    """The recorder's JSON dump, every entry (None, and why, where this torch lacks it); raises what torch raises."""
    if recorder == GLOO:
        dump = getattr(c10d, "_dump_fr_trace_json", None)
        args: Dict[str, str] = {}
    elif recorder == NCCL:
        dump = getattr(c10d, "_dump_nccl_trace_json", None)
        args = {}
    else:
        dump = getattr(c10d, "_dump_fr_trace_json", None)
        args = {"backend": recorder}
    if dump is None:
        return None, "this torch has no %s" % ("_dump_nccl_trace_json" if recorder == NCCL else "_dump_fr_trace_json")
    try:
        return dump(True, False, **args), ""  # (include collectives, only active ones): all of them
    except TypeError:
        if not args:
            raise
        return None, "this torch keeps no Flight Recorder per backend (torch 2.15 does)"


def _unsupported(recorder: str, why: str) -> FlightSummary:
    return FlightSummary(UNSUPPORTED, recorder=recorder,
                         note=("the %s Flight Recorder: %s" % (recorder, why))[:NOTE_CHARS])


def default_backends(dist: Any) -> Tuple[str, ...]:
    """As torch names the implementations ("gloo", "nccl", "nccl2"); else
    from the group's backend string ("cpu:gloo,cuda:nccl")."""
    try:
        group = dist.distributed_c10d._get_default_group()
        names = tuple(str(group._get_backend(device).name()) for device in group._device_types)
        if names:
            return names
    except Exception:
        pass
    text = str(dist.get_backend())
    return tuple(part.split(":")[-1].strip() for part in text.split(",") if part.strip())


def recorder_for(backends: Iterable[str]) -> str:
    """An NCCL backend's where the group has one (a mixed group trains on the GPU), else gloo's."""
    names = [b.lower() for b in backends] or [GLOO]
    if "nccl-legacy" in names:  # 2.15's name for stock ProcessGroupNCCL, which calls itself "nccl"
        return NCCL
    nccl = [b for b in names if b.startswith(NCCL)]
    if nccl:
        return nccl[0]
    return GLOO if GLOO in names else names[0]


@dataclass
class FlightAsk:
    directory: str
    token: str = field(default_factory=lambda: secrets.token_hex(TOKEN_CHARS // 2))
    asked: Tuple[int, ...] = ()
    later: Tuple[int, ...] = ()

    def send(self, ranks: Iterable[int]) -> "FlightAsk":
        """A rank with no FIFO is not waited for; one not in open() yet is asked again ``later``."""
        asked, later = list(self.asked), []
        for rank in ranks:
            try:
                fd = os.open(ask_path(self.directory, rank), _ASK_FLAGS)
            except OSError as e:
                if e.errno == errno.ENXIO:  # a FIFO, nobody in open() on it yet
                    later.append(rank)
                continue
            try:
                os.write(fd, self.token.encode("ascii"))
                asked.append(rank)
            except OSError:
                pass
            finally:
                os.close(fd)
        self.asked, self.later = tuple(asked), tuple(later)
        return self

    def answers(self, deadline: float) -> Dict[int, FlightSummary]:
        out: Dict[int, FlightSummary] = {}
        while True:
            if self.later:
                self.send(self.later)
            for rank in self.asked:
                if rank not in out:
                    summary = self._answer(rank)
                    if summary is not None:
                        out[rank] = summary
            if (len(out) == len(self.asked) and not self.later) or time.monotonic() >= deadline:
                return out
            time.sleep(0.02)

    def _answer(self, rank: int) -> Optional[FlightSummary]:
        data = read_json(answer_path(self.directory, rank))
        if not isinstance(data, dict) or data.get("token") != self.token:
            return None  # not yet, or an earlier question's
        try:
            return FlightSummary.from_wire(data.get("summary"))
        except FlightError:
            return FlightSummary(FAILED)


def ask(directory: str, ranks: Iterable[int]) -> FlightAsk:
    return FlightAsk(directory).send(ranks)

