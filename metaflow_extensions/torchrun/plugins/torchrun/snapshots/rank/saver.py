"""A rank's snapshots, written straight into its node's store's memory.

The store hands the rank a slot (a sealed memfd, ``memory``) for each save; the rank maps
each slot once and keeps the mapping by the slot's id, so a save in the steady state maps nothing
and faults no page. ``take`` asks for a slot, copies the tensors into it, writes the manifest and
commits: for CPU tensors that is the whole save, in the calling thread: one memcpy and two short
round trips on the Unix socket; the store holds the snapshot when ``take`` returns. A rank killed
before its commit leaves its slot uncommitted: the store's snapshots of the key are as they were.

For CUDA tensors the copy is queued on each tensor's stream into pinned host memory (the
training's later kernels on that stream run after it) and ``take`` returns; a background thread
waits for the copy's event and copies the pinned bytes into a slot, then commits. One pinned
buffer is being written out while the other takes the next snapshot; a snapshot still waiting when
the next is taken is replaced by it, so a slow store costs freshness, never the training's time.
(The slot's mapping is not registered with CUDA, so the device copy cannot land in it directly:
that costs one host memcpy in the thread, off the training's path.)
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import codec, memory
from ...procs.names import RESTART_COUNT_ENV
from .client import StoreClient, StoreError

def start_of_rank() -> int:
    """The start (the gang's restart count, or torch's own) this process is of, as the ranks' environment says."""
    text = os.environ.get(RESTART_COUNT_ENV, "0")
    return int(text) if text.isdigit() else 0


GROWTH = 1.125  # a pinned buffer's room over the snapshot that made it: a step's few more bytes fit
BUFFERS = 2  # pinned buffers a rank with CUDA state holds: one written out, one taking the next snapshot


def pinned_bytes(total: int) -> int:
    """What a rank's pinned buffers hold for a snapshot of ``total`` bytes, at most: memory of the node's
    container outside the store, counted in the node's budget."""
    return BUFFERS * int(total * GROWTH)


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


class Mapped:
    """This rank's mapping of one of the store's slots, made once: its pages made at once too."""

    def __init__(self, fd: int, capacity: int) -> None:
        import torch

        self.identity = _identity(fd)
        self.map = memory.map_shared(fd, capacity, populate=True)
        self.view = memoryview(self.map)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)

    def close(self) -> None:
        self.view.release()
        del self.tensor
        try:
            self.map.close()
        except BufferError:
            pass  # a tensor view of it is alive somewhere: it is unmapped with that view


def _identity(fd: int) -> Tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def copy_in(target: Any, plan: codec.Plan, start: int) -> List[Any]:
    """Each tensor into its place in ``target`` (a uint8 tensor); the CUDA events to wait on before
    the bytes are read. A dense CPU tensor is one ``memmove`` on this thread: torch's own copy splits a
    large one over its intra-op threads, which is slower for memory-bound work and stalls for as long
    as a core is busy elsewhere (measured: 8 ms against 16 ms for 48 MB on 2 cores, and a median 10x
    its best on a loaded machine)."""
    import torch

    devices = set()
    base = target.data_ptr()
    for (_, tensor), spec in zip(plan.tensors, plan.specs):
        if spec.nbytes == 0:
            continue
        begin = start + spec.offset
        if _plain(tensor):
            ctypes.memmove(base + begin, tensor.data_ptr(), spec.nbytes)
            continue
        place = target[begin:begin + spec.nbytes].view(tensor.dtype).view(tensor.shape)
        place.copy_(tensor, non_blocking=tensor.is_cuda)
        if tensor.is_cuda:
            devices.add(tensor.device)
    events = []
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return events


def _plain(tensor: Any) -> bool:
    """Its bytes, in order, at ``data_ptr()``: a contiguous CPU tensor that is no lazy conjugate or negation."""
    return (tensor.device.type == "cpu" and tensor.is_contiguous() and not tensor.is_conj()
            and not tensor.is_neg())


class _Pending:
    def __init__(self, step: int, buffer: HostBuffer, total: int, events: List[Any]) -> None:
        self.step, self.buffer, self.total, self.events = step, buffer, total, events

    def write_out(self, target: Mapped) -> None:
        target.tensor[:self.total].copy_(self.buffer.tensor[:self.total])


class Saver:
    """One key's snapshots (``rank-R`` or ``local-L``) from this rank to the store at ``path``."""

    def __init__(self, path: str, key: str, say: Callable[[str], None], local_ranks: int = 1) -> None:
        self.key = key
        self.start = start_of_rank()  # the gang's restart this rank is of: its snapshots' timeline
        self.local_ranks = max(1, local_ranks)  # the node's ranks: its budget is decided for all of them at once
        self._path = path
        self._say = say
        self._planner = StoreClient(path)
        self._client = StoreClient(path)
        self._io = threading.Lock()  # the client and the mappings: the training thread's or the copy thread's
        self._maps: Dict[int, Mapped] = {}
        self._planned = 0  # the size the store said fits
        self._pinned = 0  # the pinned bytes that plan counted
        self.off: Optional[str] = None  # why this rank stopped saving (said once)
        self._refusal_said = False
        self.stored_step: Optional[int] = None  # the newest step the store holds whole from this rank
        self._cond = threading.Condition()
        self._buffers: List[HostBuffer] = []
        self._sending: Optional[HostBuffer] = None
        self._pending: Optional[_Pending] = None
        self._thread: Optional[threading.Thread] = None

    def take(self, step: int, state: Any, replicated: bool = False) -> bool:
        """False when snapshots are off for this rank (said once), or the store did not keep this one (said
        once); ``SnapshotTypeError`` for what cannot be held (``replicated``: a DTensor's shard too)."""
        plan = codec.plan(state, replicated)
        manifest = codec.manifest_bytes(step, plan.tree, plan.specs)
        start, total = codec.layout(manifest, plan.data_bytes)
        cuda = any(t.is_cuda for _, t in plan.tensors)
        if self.off is not None or not self._fits(total, cuda):
            return False
        if cuda:
            return self._queue(step, plan, manifest, start, total)

        def fill(target: Mapped) -> None:
            copy_in(target.tensor, plan, start)
            codec.write_head(target.view, manifest, plan.data_bytes)

        with self._io:
            return self._write(step, total, fill)

    def _fits(self, total: int, cuda: bool) -> bool:
        """Whether the node's store plans for this size (asked again where it grew). A refusal is the node's,
        for all its ranks at once: said by the rank whose plan made it, once."""
        if total <= self._planned:
            return True
        pinned = pinned_bytes(total) if cuda else 0
        try:
            why, _budget, said = self._planner.plan(self.key, total, pinned, self.local_ranks)
        except StoreError as e:
            why, said = str(e), False
        if why is not None:
            return self._turn_off(why, said)
        self._planned, self._pinned = total, pinned
        return True

    def _turn_off(self, why: str, said: bool) -> bool:
        self.off = why
        if not said:
            self._say("snapshots are off: %s. Training goes on without them; a restart resumes from your "
                      "checkpoint" % why)
        return False

    def _node_refused(self) -> bool:
        """Whether a refused slot is the node's refusal, made since this rank's plan (another rank's grew):
        then this rank is off too, quietly (the rank that made it said so). Under ``_io``: its client."""
        try:
            why, _budget, said = self._client.plan(self.key, self._planned, self._pinned, self.local_ranks)
        except StoreError:
            return False
        return why is not None and not self._turn_off(why, said)

    def _write(self, step: int, total: int, fill: Callable[[Mapped], None]) -> bool:
        """A slot from the store, ``fill`` into it, committed: whether the store holds it now."""
        try:
            granted, dropped, why = self._client.slot(self.key, total)
            self._unmap(dropped)
            target = self._mapping(granted) if granted else None
            if granted is None and self._node_refused():
                return False
            if granted is None or target is None:
                return self._not_kept(step, why or "the store named a slot this rank never had")
            fill(target)
            why = self._client.commit(self.key, granted.slot, step, total, self.start) or ""
        except (StoreError, memory.SlotError) as e:
            why = str(e)
        if why:
            return self._not_kept(step, why)
        self.stored_step = step
        return True

    def _mapping(self, granted: Any) -> Optional[Mapped]:
        """The slot's mapping: made from its fd the first time, kept by its id after (ids are never reused for
        another memfd by one store; a store at the same path anew sends its fds again, and is told apart)."""
        mapped = self._maps.get(granted.slot)
        if granted.fd is None:
            return mapped
        try:
            if mapped is not None and mapped.identity == _identity(granted.fd):
                return mapped
            if mapped is not None:
                mapped.close()
            mapped = self._maps[granted.slot] = Mapped(granted.fd, granted.capacity)
            return mapped
        finally:
            os.close(granted.fd)

    def _unmap(self, ids: List[int]) -> None:
        for ident in ids:
            mapped = self._maps.pop(ident, None)
            if mapped is not None:
                mapped.close()

    def _not_kept(self, step: int, why: str) -> bool:
        if not self._refusal_said:
            self._refusal_said = True
            self._say("a snapshot (step %d) was not kept: %s" % (step, why))
        return False

    # -- CUDA state: pinned memory, an event, the copy thread ---------------------------

    def _queue(self, step: int, plan: codec.Plan, manifest: bytes, start: int, total: int) -> bool:
        with self._cond:
            buffer = self._free_buffer(total)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapshot-save", daemon=True)
                self._thread.start()
        events = copy_in(buffer.tensor, plan, start)
        codec.write_head(buffer.view, manifest, plan.data_bytes)
        with self._cond:
            self._pending = _Pending(step, buffer, total, events)
            self._cond.notify_all()
        return True

    def _free_buffer(self, total: int) -> HostBuffer:
        """Neither the one being written out nor, where there is another, the one waiting (superseded)."""
        idle = [b for b in self._buffers if b is not self._sending]
        waiting = self._pending.buffer if self._pending else None
        free = [b for b in idle if b is not waiting]
        if free:
            chosen: Optional[HostBuffer] = free[0]
        elif len(self._buffers) < 2:
            chosen = None
        else:
            chosen, self._pending = waiting, None  # a newer snapshot replaces the one not yet written out
        if chosen is not None and len(chosen) < total:
            self._buffers.remove(chosen)
            chosen = None
        if chosen is None:
            chosen = HostBuffer(int(total * GROWTH), pinned=True)
            self._buffers.append(chosen)
        return chosen

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                job, self._pending = self._pending, None
                assert job is not None
                self._sending = job.buffer
            for event in job.events:
                event.synchronize()
            with self._io:
                self._write(job.step, job.total, job.write_out)
            with self._cond:
                self._sending = None
                self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Whether every snapshot taken so far reached the store (or was refused) within ``timeout``: at
        once for CPU state, which ``take`` commits before it returns."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and self._sending is None, timeout)


def encode(step: int, state: Any) -> bytearray:
    """A whole snapshot at once, sealed with its digest (tests, tools): the bytes a peer receives."""
    plan = codec.plan(state)
    manifest = codec.manifest_bytes(step, plan.tree, plan.specs)
    start, total = codec.layout(manifest, plan.data_bytes)
    buffer = HostBuffer(total, pinned=False)
    for event in copy_in(buffer.tensor, plan, start):
        event.synchronize()
    codec.write_head(buffer.view, manifest, plan.data_bytes)
    codec.seal(buffer.view, total)
    return buffer.raw
