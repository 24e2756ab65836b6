"""The JobSet Metaflow submits for a ``@torchrun`` step on Kubernetes, changed in one place: a step that
can go on without a node (``spares`` or ``min_nodes``) gets its lost worker pods back, and its JobSet
completes with its control Job, not with a pod that may never come back (``launch/pod_loss.py`` says
what and why).

Metaflow has no hook for the JobSet's spec, so Metaflow's own builder is wrapped, once per process, in
the process that builds it: ``step_init`` runs in ``kubernetes step <step>`` (``run``, which submits the
JobSet) and in ``argo-workflows create`` (which writes it into the WorkflowTemplate) before either
builds anything. What is wrapped depends on the Metaflow version, found by feature, not by number:

- 2.12.9 and later: ``kubernetes_jobsets.JobSetSpec.dump``, which makes each replicated job for both
  ``KubernetesJobSet`` (``run``) and ``KubernetesArgoJobSet`` (Argo Workflows), and the ``dump`` of
  each of those two, which makes the JobSet around them (a dict for ``run``, YAML text for Argo);
- before: ``KubernetesJobSet.__init__``, which builds the whole manifest into ``_jobset`` (those
  versions compile no ``@parallel`` step for Argo Workflows).

Only the worker Job and the JobSet of a registered step change; every other Job and JobSet comes
back as Metaflow made it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, FrozenSet, Iterable, Mapping, Set, Tuple

from .launch.pod_loss import (is_worker_of, wants_lost_pods_back, with_control_success, with_lost_workers_back,
                               yaml_with_control_success)

_MARK = "_torchrun_lost_workers_back"  # on a wrapper: never wrap twice


class LostWorkersBack:
    """The steps of this process whose worker pods come back, and Metaflow's builder, wrapped at the
    first such step."""

    def __init__(self) -> None:
        self._steps: Set[str] = set()

    @property
    def steps(self) -> FrozenSet[str]:
        return frozenset(self._steps)

    def add(self, step_name: str) -> None:
        self._steps.add(step_name)
        install(self)


def _wrap_dump(original: Callable[..., Any], registry: LostWorkersBack) -> Callable[..., Any]:
    @functools.wraps(original)
    def dump(spec: Any) -> Any:
        made = original(spec)
        return with_lost_workers_back(made, registry.steps) if isinstance(made, Mapping) else made

    setattr(dump, _MARK, True)
    return dump


def _wrap_jobset_dump(original: Callable[..., Any], registry: LostWorkersBack) -> Callable[..., Any]:
    """``KubernetesJobSet.dump`` (a dict) or ``KubernetesArgoJobSet.dump`` (YAML text)."""
    @functools.wraps(original)
    def dump(jobset: Any) -> Any:
        made = original(jobset)
        if isinstance(made, Mapping):
            return with_control_success(made, registry.steps)
        worker = getattr(jobset, "worker", None)
        if isinstance(made, str) and worker is not None and is_worker_of(worker.dump(), registry.steps):
            return yaml_with_control_success(made)
        return made

    setattr(dump, _MARK, True)
    return dump


def _wrap_init(original: Callable[..., Any], registry: LostWorkersBack) -> Callable[..., Any]:
    @functools.wraps(original)
    def init(jobset: Any, *args: Any, **kwargs: Any) -> None:
        original(jobset, *args, **kwargs)
        manifest = getattr(jobset, "_jobset", None)
        spec = manifest.get("spec") if isinstance(manifest, dict) else None
        if isinstance(manifest, dict) and isinstance(spec, dict) and isinstance(spec.get("replicatedJobs"), list):
            spec["replicatedJobs"] = [with_lost_workers_back(r, registry.steps) for r in spec["replicatedJobs"]]
            jobset._jobset = with_control_success(manifest, registry.steps)

    setattr(init, _MARK, True)
    return init


def install(registry: LostWorkersBack) -> Tuple[str, str]:
    """Wrap Metaflow's JobSet builder for ``registry`` (once); returns what was wrapped."""
    from metaflow.plugins.kubernetes import kubernetes_jobsets as jobsets  # only a Kubernetes step's process

    spec_class = getattr(jobsets, "JobSetSpec", None)
    if spec_class is None:
        _wrap_once(jobsets.KubernetesJobSet, "__init__", _wrap_init, registry)
        return jobsets.KubernetesJobSet.__name__, "__init__"
    for owner in (getattr(jobsets, "KubernetesJobSet", None), getattr(jobsets, "KubernetesArgoJobSet", None)):
        if owner is not None:
            _wrap_once(owner, "dump", _wrap_jobset_dump, registry)
    _wrap_once(spec_class, "dump", _wrap_dump, registry)
    return spec_class.__name__, "dump"


def _wrap_once(owner: Any, attribute: str, wrap: Callable[..., Any], registry: LostWorkersBack) -> None:
    current = getattr(owner, attribute)
    if not getattr(current, _MARK, False):
        setattr(owner, attribute, wrap(current, registry))


REGISTRY = LostWorkersBack()


def keep_lost_workers(step_name: str, specs: Iterable[Tuple[str, Mapping[str, Any]]], step_spec: Any,
                      registry: LostWorkersBack = REGISTRY) -> bool:
    """At ``step_init``: a ``@kubernetes`` step with ``spares`` or ``min_nodes`` gets its lost worker
    pods back. ``specs``: the step's decorators (name, attributes); ``step_spec``: ``spec.StepSpec``."""
    on_kubernetes = any(name == "kubernetes" for name, _ in specs)
    if not on_kubernetes or not wants_lost_pods_back(step_spec.spares, step_spec.min_nodes):
        return False
    registry.add(step_name)
    return True
