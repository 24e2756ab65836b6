"""torchrun's process-count words (``auto``, ``gpu``, ...) turned into this node's
number before anything starts: the record and the card see a count, and a node
without a GPU is told so, not by a rank's traceback.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Tuple

from ..errors import TorchrunInvalidArgument
from ..host import count_with_torch, cuda_devices, usable_cpus
from ..launch import NO_ACCELERATORS, Accelerators, CallPlan
from ..launch.resources import check_visible_devices, keyword_note, nproc_for_keyword


def with_nproc_resolved(plan: CallPlan, accelerators: Accelerators = NO_ACCELERATORS) -> CallPlan:
    """``plan`` with a whole number of processes and a note saying what a word came to;
    ``TorchrunInvalidArgument`` for a device the node lacks, or more processes than GPUs."""
    if isinstance(plan.nproc, int):
        if accelerators.kind != "gpu":  # a CPU step runs on CPU whatever the host has
            return plan
        count = cuda_devices()
        notice = check_visible_devices(plan.nproc, accelerators, bool(count), count or 0) if count is not None else None
        return dataclasses.replace(plan, notes=plan.notes + (notice,)) if notice else plan
    keyword = plan.nproc
    count, why = count_for_keyword(keyword)
    return dataclasses.replace(plan, nproc=count, notes=plan.notes + (keyword_note(keyword, count, why),))


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
