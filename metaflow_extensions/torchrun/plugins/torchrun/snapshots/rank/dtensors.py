"""A DTensor in a snapshot, torch's side: what ``save`` keeps of it, and the DTensor ``load`` gives back.

FSDP2's ``model.state_dict()`` and its optimizer's hold DTensors: each rank's shard of every parameter
and of its Adam moments. ``save`` keeps the shard (``to_local()``) and where it sits (``codec.DTensorForm``:
its mesh, placements, the whole tensor's shape and stride); ``load`` rebuilds the DTensor with
``DTensor.from_local`` on a mesh made again from the same ranks, device type and dimension names,
which torch compares equal to the training's own: ``load_state_dict`` takes it as FSDP2 gave it. A
plain tensor of the shard's shape is refused by FSDP2's ``load_state_dict``; an optimizer takes one,
and its next step fails on mixed tensors and DTensors.

The contract: a mesh that holds every rank of the gang once (FSDP2's, HSDP's 2-D one, FSDP2 over tensor
parallelism's), placed ``Shard``, ``Replicate`` or ``_StridedShard``; refused at ``save``, named by its
key path, are a mesh sliced to part of the gang, a ``Partial`` DTensor, and a sharded DTensor in state
saved as replicated (a copy of every rank's alike: another rank's shard would be loaded). It resumes
the same gang layout: a snapshot of another world size is not found (its key names the world size) and
one whose mesh names other ranks is not used. The shard comes back on its mesh's device (a GPU for a
CUDA mesh), as ``from_local`` places it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from .codec import DTensorForm, MeshForm, SnapshotTypeError

_made: Dict[MeshForm, Tuple[Any, Any]] = {}  # a mesh made at a load, with the default group it was made in


def describe(tensor: Any, path: str, replicated: bool, meshes: List[MeshForm],
             mesh_index: Dict[int, int]) -> Tuple[Any, DTensorForm]:
    """This rank's shard of ``tensor`` and its form; its mesh added to ``meshes`` where it is new."""
    placements = tuple(_placement(p, path) for p in tensor.placements)
    if replicated and any(p[0] != "R" for p in placements):
        raise SnapshotTypeError(
            "snapshot.save: %s is a DTensor sharded across ranks (%s): save it with replicated=False, and "
            "load it with load(replicated=False) (each rank keeps its own shard)" % (path, _said(tensor)))
    mesh = tensor.device_mesh
    index = mesh_index.get(id(mesh))
    if index is None:
        form = _mesh_form(mesh, path)
        if form not in meshes:
            meshes.append(form)
        index = mesh_index[id(mesh)] = meshes.index(form)
    return tensor.to_local(), DTensorForm(index, placements, tuple(tensor.shape), tuple(tensor.stride()))


def _said(tensor: Any) -> str:
    return ", ".join(repr(p) for p in tensor.placements)


def _placement(placement: Any, path: str) -> Tuple[Any, ...]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    kind = type(placement)
    if kind is Shard:
        return ("S", int(placement.dim))
    if kind is Replicate:
        return ("R",)
    if kind is _StridedShard:
        return ("SS", int(placement.dim), int(placement.split_factor))
    raise SnapshotTypeError("snapshot.save: %s is a DTensor placed %s; a snapshot keeps DTensors placed Shard, "
                            "Replicate or _StridedShard (redistribute it first)" % (path, repr(placement)))


def _mesh_form(mesh: Any, path: str) -> MeshForm:
    import torch.distributed as dist

    ranks = tuple(int(r) for r in mesh.mesh.reshape(-1).tolist())
    world = dist.get_world_size() if dist.is_initialized() else len(ranks)
    if sorted(ranks) != list(range(world)):
        raise SnapshotTypeError(
            "snapshot.save: %s is a DTensor on a mesh of ranks %s, part of a gang of %d: a snapshot keeps "
            "DTensors on meshes that hold every rank (FSDP2's, HSDP's, a data x tensor parallel mesh), which "
            "every rank can make again at a load" % (path, list(ranks)[:8], world))
    names = tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else None
    return MeshForm(str(mesh.device_type), tuple(mesh.mesh.shape), ranks, names)


def rebuild(local: Any, form: DTensorForm, mesh: MeshForm) -> Any:
    """The DTensor ``form`` describes, ``local`` its shard, on its mesh made again (``codec.build``'s
    ``dtensor``). Every rank calls it at the same point of a load, after the gang agreed on the step:
    making a mesh of more than one dimension is collective."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, _mesh(mesh), [_placement_of(p) for p in form.placements],
                              shape=_size(form.shape), stride=form.stride)


def _mesh(form: MeshForm) -> Any:
    """The mesh, made once a process group: a second load (or a second tensor) reuses it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.group.WORLD
    made = _made.get(form)
    if made is not None and made[0] is world:
        return made[1]
    ranks = torch.tensor(form.ranks, dtype=torch.int64).reshape(form.shape)
    mesh = DeviceMesh(form.device, ranks, mesh_dim_names=form.names)
    _made[form] = (world, mesh)
    return mesh


def _placement_of(form: Tuple[Any, ...]) -> Any:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if form[0] == "S":
        return Shard(form[1])
    if form[0] == "SS":
        return _StridedShard(form[1], split_factor=form[2])
    return Replicate()


def _size(shape: Tuple[int, ...]) -> Any:
    import torch

    return torch.Size(shape)
