"""What a JobSet's worker Job does when Kubernetes takes one of its pods away, in pure functions.

Metaflow gives each Job of a ``@parallel`` step's JobSet ``backoffLimit`` = its retries (0 unless
Argo Workflows retries), and the JobSet no failure policy: one worker pod evicted, preempted or lost
with its node fails its Job, the Job fails the JobSet, and the JobSet ends every pod. A step that can
go on without a node (``@torchrun(spares=K)`` or ``min_nodes``) needs that pod back, not the step
ended, so the worker Job gets a pod failure policy: a pod failure that Kubernetes marks as a
disruption (the pod condition ``DisruptionTarget``) is ignored, which makes the Job create the same
pod again, with the same job index, so the same Metaflow task id, without counting a retry.

Only a disruption: a pod that fails on its own (the task exits non-zero, an OOM kill) still fails the
Job as before, so a failing task is never restarted in a loop. The control Job keeps Metaflow's
spec: the control task holds the gang, and its loss ends the step whatever this policy says.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, Mapping, Optional

# The JobSet's replicated job that holds nodes 1..N-1 (Metaflow's name, every version).
WORKER_JOB = "worker"
# The pod condition the API server, the scheduler, the taint manager, the kubelet and the pod garbage
# collector set on a pod they are about to end for a reason outside it.
DISRUPTION_CONDITION = "DisruptionTarget"
# Kubernetes refuses a podFailurePolicy on a pod template with any other restart policy.
REQUIRED_RESTART_POLICY = "Never"


def wants_lost_pods_back(spares: Any, min_nodes: Any) -> bool:
    """A step whose gang can go on without a node: hot spares, or a floor below ``num_parallel``."""
    return (isinstance(spares, int) and spares > 0) or min_nodes is not None


def disruption_rule() -> Dict[str, Any]:
    """The rule, as the Job API spells it: a disrupted pod is replaced, its failure not counted."""
    return {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION_CONDITION, "status": "True"}]}


def container_step(template: Mapping[str, Any]) -> Optional[str]:
    """The step a Job template runs: Metaflow names the pod's one container after it (``_`` -> ``-``)."""
    job = template.get("spec") or {}
    containers = ((job.get("template") or {}).get("spec") or {}).get("containers") or []
    names = [c.get("name") for c in containers if isinstance(c, Mapping)]
    return names[0] if len(names) == 1 and isinstance(names[0], str) else None


def k8s_step_name(step_name: str) -> str:
    """A step's name as Metaflow writes it in Kubernetes objects (Argo's sanitising; unique, since a
    Metaflow step name has no ``-``)."""
    return step_name.replace("_", "-")


def with_disruption_rule(job_template: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of a serialized ``JobTemplateSpec`` whose Job replaces a disrupted pod. Unchanged where
    Kubernetes would refuse the policy (a restart policy other than ``Never``); rules already there
    are kept, ours goes first (the first matching rule wins) and is never added twice."""
    out = copy.deepcopy(dict(job_template))
    job = out.setdefault("spec", {})
    pod = (job.get("template") or {}).get("spec") or {}
    if pod.get("restartPolicy") != REQUIRED_RESTART_POLICY:
        return out
    policy = job.get("podFailurePolicy") or {}
    rules = [r for r in policy.get("rules") or [] if r != disruption_rule()]
    job["podFailurePolicy"] = dict(policy, rules=[disruption_rule()] + rules)
    return out


def with_lost_workers_back(replicated_job: Mapping[str, Any], steps: Iterable[str]) -> Dict[str, Any]:
    """A JobSet ``replicatedJobs`` entry, with the disruption rule if it is the worker Job of one of
    ``steps`` (step names as the flow spells them); any other entry comes back as it was."""
    template = replicated_job.get("template")
    wanted = {k8s_step_name(s) for s in steps}
    if replicated_job.get("name") != WORKER_JOB or not isinstance(template, Mapping):
        return dict(replicated_job)
    if container_step(template) not in wanted:
        return dict(replicated_job)
    return dict(replicated_job, template=with_disruption_rule(template))
