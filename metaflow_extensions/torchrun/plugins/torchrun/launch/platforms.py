"""Settings that fail only on a platform, refused at ``step_init`` before any pod, job or task starts,
not seconds into a run on a cluster with a message naming neither setting."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

from ..errors import TorchrunInvalidArgument
from ..gang import parse_port

DecoratorSpec = Tuple[str, Mapping[str, Any]]


def kubernetes_port(specs: Iterable[DecoratorSpec]) -> Optional[int]:
    """``@kubernetes(port=N)`` of the step, if any."""
    for name, attributes in specs:
        if name == "kubernetes":
            return parse_port((attributes or {}).get("port"), "@kubernetes(port)")
    return None


def check_port_clash(specs: Iterable[DecoratorSpec], gang_port: Optional[int], rdzv_port: Optional[int],
                     rdzv_source: str = "@torchrun(rdzv_port)") -> None:
    """torchrun's rendezvous pinned to the port the gang service takes from ``@kubernetes(port=N)`` (without
    ``@torchrun(port)``) would bind it twice on the control pod. ``rdzv_source``: where the pin came from."""
    exposed = kubernetes_port(specs)
    if exposed is None or gang_port is not None or rdzv_port != exposed:
        return
    raise TorchrunInvalidArgument(
        "@kubernetes(port=%d) and %s=%d: the gang service listens on the port @kubernetes exposes, "
        "and torchrun's rendezvous cannot take the same port on the control pod. Drop %s (the gang "
        "picks a free rendezvous port for each call), or pin it to another port." % (
            exposed, rdzv_source, exposed, rdzv_source))


def refuse_step_functions(argv: Sequence[str]) -> None:
    """Step Functions runs no ``@parallel`` step: Metaflow refuses it without saying what runs one."""
    args = list(argv)[1:]
    if "step-functions" not in args:
        return
    after = args[args.index("step-functions") + 1:]
    if "create" not in after:
        return
    raise TorchrunInvalidArgument(
        "@torchrun steps cannot be deployed to AWS Step Functions: Step Functions runs no @parallel "
        "step (Metaflow refuses them). Deploy with `argo-workflows create` (a JobSet on Kubernetes), "
        "or run the flow with `run --with batch`, `run --with kubernetes` or locally with `run`.")


def refuse_one_node_on_kubernetes(specs: Iterable[DecoratorSpec], num_parallel: Sequence[str]) -> None:
    """A literal ``num_parallel=1`` (the source text of ``self.next``'s) on ``@kubernetes``: Metaflow
    refuses it only when it launches the pod, after the steps before it ran."""
    if not any(name == "kubernetes" for name, _ in specs):
        return
    if any(str(text).strip() == "1" for text in num_parallel):
        raise TorchrunInvalidArgument(
            "num_parallel=1 on a @kubernetes step: Metaflow runs @parallel on Kubernetes only with 2 or more "
            "nodes (it refuses 1 when it launches the pod). For one node with several GPUs, use "
            "num_parallel=2 or more, or TorchrunSingleNodeMultiGPU in an ordinary step.")
