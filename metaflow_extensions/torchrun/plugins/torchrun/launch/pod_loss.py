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

A pod re-created may never run (no node to put it on). The JobSet Metaflow writes has no success
policy: it completes once every Job does, so it would wait for that pod, and the step with it, for
good. So the same JobSet completes once its control Job does (the control task ends only after every
node's task it lists for the join has stored its artifacts, and ends its step without a node that
never came back); on completion the JobSet controller deletes the Jobs still active, that pod's among
them. A failed Job still fails the JobSet, as before.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, Mapping, Optional

# The JobSet's replicated jobs: node 0's and nodes 1..N-1's (Metaflow's names, every version).
CONTROL_JOB = "control"
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


def is_worker_of(replicated_job: Any, steps: Iterable[str]) -> bool:
    """Whether a JobSet ``replicatedJobs`` entry is the worker Job of one of ``steps`` (as the flow spells them)."""
    if not isinstance(replicated_job, Mapping) or replicated_job.get("name") != WORKER_JOB:
        return False
    template = replicated_job.get("template")
    return isinstance(template, Mapping) and container_step(template) in {k8s_step_name(s) for s in steps}


def with_lost_workers_back(replicated_job: Mapping[str, Any], steps: Iterable[str]) -> Dict[str, Any]:
    """A JobSet ``replicatedJobs`` entry, with the disruption rule if it is the worker Job of one of
    ``steps`` (step names as the flow spells them); any other entry comes back as it was."""
    if not is_worker_of(replicated_job, steps):
        return dict(replicated_job)
    return dict(replicated_job, template=with_disruption_rule(replicated_job["template"]))


def control_success() -> Dict[str, Any]:
    """The JobSet's success policy, as its API spells it: complete once the control Job has."""
    return {"operator": "All", "targetReplicatedJobs": [CONTROL_JOB]}


def with_control_success(jobset: Mapping[str, Any], steps: Iterable[str]) -> Dict[str, Any]:
    """A copy of a JobSet manifest that completes with its control Job, if its worker Job is one of
    ``steps``'; any other comes back as it was."""
    out = copy.deepcopy(dict(jobset))
    spec = out.get("spec")
    if not isinstance(spec, dict) or not any(is_worker_of(r, steps) for r in spec.get("replicatedJobs") or ()):
        return out
    spec["successPolicy"] = control_success()
    return out


def yaml_with_control_success(text: str) -> str:
    """The JobSet Metaflow writes for Argo Workflows (YAML with Argo's templates in it, so not read back):
    its one ``successPolicy: null`` line made the policy above, at the same indent. Unchanged where the
    line is not there once."""
    lines = text.split("\n")
    found = [i for i, line in enumerate(lines) if line.strip() == "successPolicy: null"]
    if len(found) != 1:
        return text
    at = found[0]
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    block = [indent + "successPolicy:", indent + "  operator: All", indent + "  targetReplicatedJobs:",
             indent + "  - " + CONTROL_JOB]
    return "\n".join(lines[:at] + block + lines[at + 1:])
