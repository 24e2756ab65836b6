"""A rank's training state, kept in its node's memory, so a restart resumes where it failed.

    from metaflow_extensions.torchrun.snapshot import load, save

    dist.init_process_group("gloo")
    resumed = load()                      # (step, state) every rank holds, or None
    if resumed:
        first, state = resumed
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    for step in range(first, steps):
        ...
        save(step + 1, {"model": model.state_dict(), "opt": opt.state_dict()})

``save`` copies the tensors straight into memory the node's store owns (the task's, not a disk:
a sealed memfd the store hands the rank) and commits; CPU state is held by the store when it
returns, CUDA state once its device-to-host copy lands, in the background. ``load`` picks the
newest step that every rank of the gang holds whole (a save cut short is never committed) from the
same start (a snapshot is known by the start that took it and its step: a rank killed in its save of
step S in one start leaves the previous start's S, which the others replaced with theirs; resuming
from both would mix two timelines), each rank checking its snapshot's bounds before use.
``replicated=True`` (the default) is for state every rank holds alike (DDP's model and optimizer):
the node keeps it once per local rank, and any node's copy serves a node that replaces another.
``replicated=False`` is for a rank's own shard (FSDP, DTensor: its local shard is kept, and ``load``
gives back the DTensor, ``dtensors``), each also copied to a buddy node. Pass the same ``replicated``
to ``load`` as to ``save``.

Outside ``@torchrun``, or under it with snapshots off (no store in ``SNAPSHOT_ENV``), ``save`` keeps
nothing and ``load`` returns None, said once: under ``@torchrun`` by rank 0 of the first start, with the
reason the runtime gives in ``SNAPSHOTS_OFF_ENV``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

from . import codec, dtensors
from ...procs.names import (OFF_BY_SETTING, OFF_NO_RESTARTS, OFF_ON_NODE, RESTART_COUNT_ENV, SNAPSHOT_ENV,
                    SNAPSHOTS_OFF_ENV)
from .client import Loaded, StoreClient, StoreError
from .saver import Saver
from .wire import key_for

SnapshotTypeError = codec.SnapshotTypeError
FLUSH_AT_EXIT = 30.0  # seconds a clean exit waits for the last snapshot to reach the store
MAX_AGREED = 8  # snapshots a rank offers to the agreement (a store keeps 2)
Held = Tuple[int, int]  # a snapshot's identity: (the start that took it, its step)

_savers: Dict[Tuple[str, str], Saver] = {}
_lock = threading.Lock()
_said: Set[str] = set()


def _say(text: str, once: Optional[str] = None) -> None:
    if once is not None:
        if once in _said:
            return
        _said.add(once)
    sys.stderr.write("metaflow-torchrun: snapshot: %s\n" % text)
    sys.stderr.flush()


# Why a rank under @torchrun has no store (SNAPSHOTS_OFF_ENV), as its one line says it.
_OFF = {
    OFF_BY_SETTING: "snapshots are off for this step (`@torchrun(snapshots=False)`)",
    OFF_NO_RESTARTS: "snapshots are off for this step: they serve an in-step restart, and it allows none "
                     "(`@torchrun(restarts=N)` turns them on)",
    OFF_ON_NODE: "snapshots are off on this node: its store could not start (the step's log says why)",
}
NO_STORE = ": save() keeps nothing and load() returns None"


def _store_path() -> Optional[str]:
    path = os.environ.get(SNAPSHOT_ENV, "")
    if not path:
        why = os.environ.get(SNAPSHOTS_OFF_ENV)
        if why is None:  # not under @torchrun: every process of a plain run says it once
            _say("no @torchrun snapshot store here (this process does not run under @torchrun)" + NO_STORE,
                 once="no store")
        elif _says_for_the_gang(why):
            _say(_OFF.get(why, "snapshots are off for this step") + NO_STORE, once="no store")
    return path or None


def _says_for_the_gang(why: str) -> bool:
    """Once a run, not once a rank: rank 0 of the first start (where a node's store is off, its local rank 0)."""
    if why == OFF_ON_NODE:
        return _env_int("LOCAL_RANK") == 0
    return _env_int("RANK") == 0 and not restarted()


def restarted() -> bool:
    """Whether this process is a restart's (the gang's restart, or torch's own): where a resume is said."""
    return _env_int(RESTART_COUNT_ENV) > 0


def _identity() -> Tuple[int, int, int]:
    """(rank, local rank, world size), from torch.distributed where it is up, else torchrun's environment."""
    dist = _dist()
    rank = dist.get_rank() if dist else _env_int("RANK")
    world = dist.get_world_size() if dist else max(1, _env_int("WORLD_SIZE"))
    return rank, _env_int("LOCAL_RANK"), world


def _env_int(name: str) -> int:
    text = os.environ.get(name, "0")
    return int(text) if text.isdigit() else 0


def _dist() -> Any:
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def save(step: int, state: Any, replicated: bool = True) -> bool:
    """Take a snapshot of ``state`` at ``step``: True once it is copied out of the training's way
    (CPU state: once the node's store holds it).

    False when no store is here, snapshots are off for this rank (over the node's budget: said
    once, with both sizes), or the store did not keep this one (said once). ``SnapshotTypeError``
    names a value that cannot be held, by its key path.
    """
    path = _store_path()
    if path is None:
        codec.plan(state, replicated)  # what cannot be held is named here too, not at a restart under @torchrun
        return False
    rank, local_rank, world = _identity()
    key = key_for(replicated, rank, local_rank, world)
    with _lock:
        saver = _savers.get((path, key))
        if saver is None:
            saver = _savers[(path, key)] = Saver(path, key, lambda text: _say("rank %d: %s" % (rank, text)),
                                                 _env_int("LOCAL_WORLD_SIZE"))
    return saver.take(step, state, replicated)


def flush(timeout: float = FLUSH_AT_EXIT) -> bool:
    """Wait until every snapshot taken has reached the store; whether it did within ``timeout``."""
    with _lock:
        savers = list(_savers.values())
    return all(saver.flush(timeout) for saver in savers)


atexit.register(flush)


def load(replicated: bool = True) -> Optional[Tuple[int, Any]]:
    """The newest snapshot every rank of the gang holds whole, as ``(step, state)``; None if there is none.

    Under a gang of more than one rank, call it after ``init_process_group`` and on every rank: the
    ranks agree on the step through two small collectives. The state's tensors are on the CPU; a
    DTensor's comes back a DTensor, on its mesh's device.
    A restart's first load is a resume, and rank 0 says where it resumed; any other call (mid-run, or
    on a first start) returns the same and says nothing: nothing was restarted.
    """
    path = _store_path()
    rank, local_rank, world = _identity()
    if world > 1 and _dist() is None and path is not None:
        raise RuntimeError("snapshot.load() on a gang of %d ranks: call torch.distributed.init_process_group "
                           "first, so that every rank agrees on the step" % world)
    key = key_for(replicated, rank, local_rank, world)
    client = StoreClient(path) if path else None
    try:
        return _load(client, key, rank)
    finally:
        if client:
            client.close()


def _load(client: Optional[StoreClient], key: str, rank: int) -> Optional[Tuple[int, Any]]:
    held: List[Held] = []
    if client is not None:
        try:
            held = client.held(key)
        except StoreError as e:
            _say("rank %d: %s: resuming from nothing in memory" % (rank, e))
    common = agree(held)
    while common:
        start, step = max(common, key=lambda h: (h[1], h[0]))
        read = _read(client, key, start, step, rank) if client else None
        if _everyone(read is not None):
            assert read is not None
            if rank == 0 and restarted():  # a first start's load, or a later one, resumes nothing
                _say(resumed_line(step, read[1]), once="resumed")
            # Built once every rank holds the step: a DTensor's mesh of 2 dimensions is made collectively.
            return codec.build(read[1].blob, read[0], dtensors.rebuild)
        common.discard((start, step))
    if rank == 0 and client is not None and restarted():  # a first start has none to find
        _say("no snapshot in memory that every rank holds: resuming from your checkpoint", once="resumed")
    return None


def resumed_line(step: int, loaded: Loaded) -> str:
    """What rank 0 says of a resume: the step, whose copy, and the steps saved since that are lost."""
    lost = max(0, (loaded.newest if loaded.newest is not None else step) - step)
    where = "this node's copy" if loaded.node is None else "node %d's copy" % loaded.node
    return "resumed at step %d from memory (%s), %d step%s lost" % (step, where, lost, "" if lost == 1 else "s")


def _read(client: StoreClient, key: str, start: int, step: int, rank: int
          ) -> Optional[Tuple[codec.Decoded, Loaded]]:
    try:
        loaded = client.get(key, step, start)
        if loaded is None:
            return None
        dist = _dist()
        return codec.check(loaded.blob, digest=False, world=dist.get_world_size() if dist else 1), loaded
    except (StoreError, codec.SnapshotError) as e:
        _say("rank %d: the snapshot of step %d is not used: %s" % (rank, step, e))
        return None


def agree(held: List[Held]) -> Set[Held]:
    """The (start, step) every rank holds (this rank's alone outside a gang): a step two starts each left on
    some ranks is no common one."""
    mine = set(sorted(held, key=lambda h: (h[1], h[0]))[-MAX_AGREED:])
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return mine
    import torch

    row = torch.full((MAX_AGREED, 2), -1, dtype=torch.int64, device=_device(dist))
    for i, (start, step) in enumerate(sorted(mine)):
        row[i, 0], row[i, 1] = start, step
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    for other in rows:
        mine &= {(int(a), int(b)) for a, b in other.tolist() if b >= 0}
    return mine


def _everyone(ok: bool) -> bool:
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return ok
    import torch

    flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=_device(dist))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _device(dist: Any) -> Any:
    """Where the default group's backend takes tensors: NCCL's on this rank's GPU."""
    import torch

    if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
