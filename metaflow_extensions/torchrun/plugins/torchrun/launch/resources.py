"""The process count, resolved here alone: the processes per node the step's requested hardware
calls for, from ``(decorator name, attributes)`` pairs (pure, so that ``run --with kubernetes:gpu=4``
counts like any other decorator), and a call's count on this node (``resolved_nproc``): torchrun's
words (``auto``, ``gpu``, ...) turned into a number before anything starts, so the record and the
card see a count, and a node without a GPU is told so, not by a rank's traceback."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Tuple, Union

from ..errors import TorchrunInvalidArgument, shown
from ..host.devices import count_with_torch, cuda_devices, usable_cpus

# NeuronCores per @batch(trainium=N / inferentia=N) device (trn1, Inferentia2); others set nproc_per_node.
NEURON_CORES_PER_DEVICE = 2

DecoratorSpec = Tuple[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Accelerators:
    """What the step asked for on each node."""

    kind: str  # "gpu", "neuron" or "none"
    count: int
    source: str  # which decorator(s) it came from, for messages

    @property
    def nproc(self) -> Optional[int]:
        if self.kind == "gpu":
            return self.count
        if self.kind == "neuron":
            return self.count * NEURON_CORES_PER_DEVICE
        return None


NO_ACCELERATORS = Accelerators("none", 0, "no accelerator requested")
NONE = NO_ACCELERATORS  # the name tests and earlier code use


def _count(value: Any, where: str) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TorchrunInvalidArgument("%s=%s is not a number of devices." % (where, shown(value))) from None
    if number < 0 or not number.is_integer():
        raise TorchrunInvalidArgument("%s=%s must be a whole number of devices." % (where, shown(value)))
    return int(number)


def requested_accelerators(decorators: Iterable[DecoratorSpec]) -> Accelerators:
    """``@resources`` with ``@kubernetes`` or ``@batch`` as Metaflow sizes the pod or job: on Kubernetes
    ``@resources``' GPU count replaces the decorator's, on Batch the larger wins, locally it stands alone."""
    decos = {name: dict(attrs or {}) for name, attrs in decorators}
    gpu: Optional[int]
    res_gpu = _count(decos.get("resources", {}).get("gpu"), "@resources(gpu)")
    if "kubernetes" in decos:
        k8s_gpu = _count(decos["kubernetes"].get("gpu"), "@kubernetes(gpu)")
        if res_gpu is not None:
            gpu, source = res_gpu, "@resources(gpu=%d)" % res_gpu
        else:
            gpu, source = k8s_gpu, "@kubernetes(gpu=%s)" % k8s_gpu
    elif "batch" in decos:
        batch = decos["batch"]
        neuron = _count(
            batch.get("inferentia") if batch.get("inferentia") is not None else batch.get("trainium"),
            "@batch(trainium/inferentia)",
        )
        if neuron:
            return Accelerators("neuron", neuron, "@batch(trainium/inferentia=%d)" % neuron)
        batch_gpu = _count(batch.get("gpu"), "@batch(gpu)")
        if batch_gpu is not None and res_gpu is not None:
            gpu = max(batch_gpu, res_gpu)
            source = "max(@batch(gpu=%d), @resources(gpu=%d))" % (batch_gpu, res_gpu)
        elif batch_gpu is not None:
            gpu, source = batch_gpu, "@batch(gpu=%d)" % batch_gpu
        else:
            gpu, source = res_gpu, "@resources(gpu=%s)" % res_gpu
    else:
        gpu, source = res_gpu, "@resources(gpu=%s)" % res_gpu
    if not gpu:
        return NO_ACCELERATORS
    return Accelerators("gpu", gpu, source)


def check_visible_devices(
    nproc: int, accelerators: Accelerators, cuda_available: bool, cuda_count: int
) -> Optional[str]:
    """Whether this node can run ``nproc`` processes: a notice to log once, or None. Raises only where the
    step asked for GPUs and CUDA has fewer (NCCL would fail later, obscurely); a step that asked for none
    runs on CPU (gloo) whatever the machine has."""
    if accelerators.kind != "gpu":
        return None
    if cuda_available:
        if nproc > cuda_count:
            raise TorchrunInvalidArgument(
                "nproc_per_node=%d but this node has only %d visible CUDA device%s (CUDA_VISIBLE_DEVICES honoured). "
                "The step asks for %s: ask for at most %d processes, or for more GPUs."
                % (nproc, cuda_count, "" if cuda_count == 1 else "s", accelerators.source, cuda_count))
        return None
    return ("the step asks for %d GPU%s (%s) but no CUDA device is visible on this node; running %d process%s per "
            "node on CPU (use the gloo backend)." % (accelerators.count, "" if accelerators.count == 1 else "s",
                                                     accelerators.source, nproc, "" if nproc == 1 else "es"))


def small_shm_warning(decorators: Iterable[DecoratorSpec], accelerators: Accelerators, nproc: Any) -> Optional[str]:
    """NCCL between a node's processes goes through /dev/shm, 64 MiB in containers unless the step asks
    for more: said before the run, not as an NCCL error in the middle of it."""
    count = nproc if isinstance(nproc, int) else accelerators.nproc
    if accelerators.kind != "gpu" or not count or count < 2:
        return None
    for name, attributes in decorators:
        if name in ("kubernetes", "batch") and not (attributes or {}).get("shared_memory"):
            return ("%d GPU processes per node share /dev/shm, which is 64 MiB in most containers; consider "
                    "@%s(shared_memory=<MiB>) for NCCL." % (count, name))
    return None


def nproc_for_keyword(keyword: str, cuda_count: Optional[int], cpus: int) -> Tuple[Optional[int], str]:
    """torchrun's words for "one process per device" as the count they mean here (torchrun's meaning), and
    why, so that the record, the card and the plan hold the count that ran. ``(None, "")`` where the
    driver's files cannot decide (MIG, XPU): the caller asks torch."""
    if keyword == "cpu":
        return cpus, "one per CPU this task may use (%d)" % cpus
    if keyword == "xpu" or cuda_count is None:
        return None, ""
    if cuda_count > 0:
        return cuda_count, "one per visible CUDA device (%d)" % cuda_count
    if keyword == "gpu":
        raise TorchrunInvalidArgument("nproc_per_node='gpu' but this node has no visible CUDA device: give a number, "
                                      "or 'auto' (one process per CPU without a GPU, as torchrun does).")
    return cpus, "no CUDA device: one per CPU this task may use (%d), as torchrun does" % cpus


def keyword_note(keyword: str, count: int, why: str) -> str:
    return "nproc_per_node=%r: %d process%s on this node (%s)." % (keyword, count, "" if count == 1 else "es", why)


def resolved_nproc(nproc: Union[int, str], accelerators: Accelerators = NO_ACCELERATORS) -> Tuple[int, Optional[str]]:
    """This node's whole number of processes for a call's ``nproc``, and a note to say (what a word came
    to, or a GPU step on a node without one); ``TorchrunInvalidArgument`` for a device the node lacks,
    or more processes than GPUs."""
    if isinstance(nproc, int):
        if accelerators.kind != "gpu":  # a CPU step runs on CPU whatever the host has
            return nproc, None
        count = cuda_devices()
        return nproc, (check_visible_devices(nproc, accelerators, bool(count), count or 0)
                       if count is not None else None)
    count, why = count_for_keyword(nproc)
    return count, keyword_note(nproc, count, why)


def count_for_keyword(keyword: str) -> Tuple[int, str]:
    """The number of processes a torchrun word stands for on this node, and why."""
    cpus = usable_cpus()
    count, why = nproc_for_keyword(keyword, cuda_devices(), cpus)
    if count is not None:
        return count, why
    kind = "xpu" if keyword == "xpu" else "cuda"
    asked = count_with_torch(kind, sys.executable)
    if asked is None:
        raise TorchrunInvalidArgument(
            "nproc_per_node=%r: this node's %s devices could not be counted (torch did not answer): "
            "give a number." % (keyword, kind.upper()))
    if asked == 0 and keyword != "auto":
        raise TorchrunInvalidArgument("nproc_per_node=%r but torch sees no %s device on this node: "
                                      "give a number." % (keyword, kind.upper()))
    if asked:
        return asked, "one per %s device torch sees (%d)" % (kind.upper(), asked)
    return cpus, "no %s device: one per CPU this task may use (%d), as torchrun does" % (kind.upper(), cpus)
