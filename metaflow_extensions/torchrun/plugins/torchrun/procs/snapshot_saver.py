"""A rank's snapshots on their way to its node's store, off the training's path.

``take`` copies the state into one of two reusable host buffers and returns: for CUDA tensors
the copy is queued on each tensor's stream into pinned memory (the training's later kernels
on that stream run after it), for CPU tensors it is a memcpy. A background thread waits for the
copy, seals the snapshot (its SHA-256) and sends it. One buffer is being sent while the other
takes the next snapshot; a snapshot still waiting when the next is taken is replaced by it, so
a slow store costs freshness, never the training's time or more memory.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, List, Optional

from . import snapshot_codec as codec
from .snapshot_client import StoreClient, StoreError

GROWTH = 1.125  # a buffer's room over the snapshot that made it: a step's few more bytes fit


class HostBuffer:
    """Host memory a snapshot is built in: pinned when it takes device tensors."""

    def __init__(self, size: int, pinned: bool) -> None:
        import torch

        self.pinned = pinned
        if pinned:
            self.tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            array = (ctypes.c_ubyte * size).from_address(self.tensor.data_ptr())
            self.view = memoryview(array).cast("B")
        else:
            self.raw = bytearray(size)
            self.tensor = torch.frombuffer(self.raw, dtype=torch.uint8)
            self.view = memoryview(self.raw)

    def __len__(self) -> int:
        return len(self.view)


def copy_in(buffer: HostBuffer, plan: codec.Plan, start: int) -> List[Any]:
    """Each tensor into its place; the CUDA events to wait on before the bytes are read."""
    import torch

    devices = set()
    for (_, tensor), spec in zip(plan.tensors, plan.specs):
        if spec.nbytes == 0:
            continue
        begin = start + spec.offset
        place = buffer.tensor[begin:begin + spec.nbytes].view(tensor.dtype).view(tensor.shape)
        place.copy_(tensor, non_blocking=tensor.is_cuda)
        if tensor.is_cuda:
            devices.add(tensor.device)
    events = []
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return events


class _Pending:
    def __init__(self, step: int, buffer: HostBuffer, total: int, events: List[Any]) -> None:
        self.step, self.buffer, self.total, self.events = step, buffer, total, events


class Saver:
    """One key's snapshots (``rank-R`` or ``local-L``) from this rank to the store at ``path``."""

    def __init__(self, path: str, key: str, say: Callable[[str], None]) -> None:
        self.key = key
        self._path = path
        self._say = say
        self._planner = StoreClient(path)
        self._planned = 0  # the size the store said fits
        self.off: Optional[str] = None  # why this rank stopped saving (said once)
        self._refusal_said = False
        self._cond = threading.Condition()
        self._buffers: List[HostBuffer] = []
        self._sending: Optional[HostBuffer] = None
        self._pending: Optional[_Pending] = None
        self.stored_step: Optional[int] = None  # the newest step the store holds whole from this rank
        self._thread = threading.Thread(target=self._run, name="snapshot-save", daemon=True)
        self._thread.start()

    def take(self, step: int, state: Any) -> bool:
        """False when snapshots are off for this rank (said once); ``SnapshotTypeError`` for what cannot be held."""
        plan = codec.plan(state)
        manifest = codec.manifest_bytes(step, plan.tree, plan.specs)
        start, total = codec.layout(manifest, plan.data_bytes)
        if self.off is not None or not self._fits(total):
            return False
        pinned = any(t.is_cuda for _, t in plan.tensors)
        with self._cond:
            buffer = self._free_buffer(total, pinned)
        events = copy_in(buffer, plan, start)
        codec.write_head(buffer.view, manifest, plan.data_bytes)
        with self._cond:
            self._pending = _Pending(step, buffer, total, events)
            self._cond.notify_all()
        return True

    def _fits(self, total: int) -> bool:
        if total <= self._planned:
            return True
        try:
            why, _budget = self._planner.plan(self.key, total)
        except StoreError as e:
            why = str(e)
        if why is not None:
            self.off = why
            self._say("snapshots are off for this rank: %s. Training goes on without them; a restart resumes "
                      "from your checkpoint" % why)
            return False
        self._planned = int(total * GROWTH)  # asked again only once it grows past this
        return True

    def _free_buffer(self, total: int, pinned: bool) -> HostBuffer:
        """Neither the one being sent nor, where there is another, the one waiting (which is superseded)."""
        idle = [b for b in self._buffers if b is not self._sending]
        waiting = self._pending.buffer if self._pending else None
        free = [b for b in idle if b is not waiting]
        if free:
            chosen: Optional[HostBuffer] = free[0]
        elif len(self._buffers) < 2:
            chosen = None
        else:
            chosen, self._pending = waiting, None  # a newer snapshot replaces the one not yet sent
        if chosen is not None and (len(chosen) < total or chosen.pinned != pinned):
            self._buffers.remove(chosen)
            chosen = None
        if chosen is None:
            chosen = HostBuffer(int(total * GROWTH), pinned)
            self._buffers.append(chosen)
        return chosen

    def _run(self) -> None:
        client = StoreClient(self._path)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                job, self._pending = self._pending, None
                assert job is not None
                self._sending = job.buffer
            why = self._send(client, job)
            with self._cond:
                self._sending = None
                if why is None:
                    self.stored_step = job.step
                self._cond.notify_all()

    def _send(self, client: StoreClient, job: _Pending) -> Optional[str]:
        for event in job.events:
            event.synchronize()
        codec.seal(job.buffer.view, job.total)
        try:
            why = client.put(self.key, job.step, job.buffer.view[:job.total])
        except StoreError as e:
            why = str(e)
        if why is not None and not self._refusal_said:
            self._refusal_said = True
            self._say("a snapshot (step %d) was not kept: %s" % (job.step, why))
        return why

    def flush(self, timeout: float) -> bool:
        """Whether every snapshot taken so far reached the store (or was refused) within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and self._sending is None, timeout)


def encode(step: int, state: Any) -> bytearray:
    """A whole snapshot at once, in the calling thread (tests, tools): what ``take`` and the thread make."""
    plan = codec.plan(state)
    manifest = codec.manifest_bytes(step, plan.tree, plan.specs)
    start, total = codec.layout(manifest, plan.data_bytes)
    buffer = HostBuffer(total, pinned=False)
    for event in copy_in(buffer, plan, start):
        event.synchronize()
    codec.write_head(buffer.view, manifest, plan.data_bytes)
    codec.seal(buffer.view, total)
    return buffer.raw
