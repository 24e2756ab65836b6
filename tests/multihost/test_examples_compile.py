"""Every shipped example compiles for Kubernetes through Metaflow's own Argo
Workflows compiler (``argo-workflows create --only-json``, no cluster, the code
package on moto's S3), with and without ``@retry``; each ``@parallel`` step's
JobSet is checked against the JobSet CRD's schema, and each pod template
against the ``kubernetes`` client's models: a round trip through
``V1PodTemplateSpec`` keeps every field (a field the client does not know, or
of the wrong type, shows), and what @torchrun relies on is there (one
container, its port, the gang's variables) or, for the grace period, what the
docs say: ``terminationGracePeriodSeconds: 0``, Metaflow's, so a deleted pod
gets no time to save (docs/failures.md)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import uuid

import extras
import pytest

from .test_submitted import (  # noqa: F401  (moto: the module's server fixture)
    K8S_VARS,
    REPO,
    _argo_values,
    _flow_env,
    _pods,
    _prune_nulls,
    _substitute,
    moto,
    validate_jobset,
)

EXAMPLES = sorted(glob.glob(os.path.join(REPO, "examples", "*", "flow.py")))


def _compile(moto, tmp, flow, retry):  # noqa: F811
    env = _flow_env(moto, tmp, "kubernetes", {}, 2)
    if os.path.basename(os.path.dirname(flow)) == "checkpoint":  # @checkpoint: metaflow-checkpoint, installed apart
        env = extras.with_checkpoint(env)
    top = ["--with", "retry:times=2"] if retry else []
    proc = subprocess.run([sys.executable, flow, "--no-pylint", *top, "argo-workflows", "create", "--only-json"],
                          cwd=os.path.dirname(flow), env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120)
    return proc


def _jobsets(workflow, nodes=2):
    """(step, raw template, JobSet manifest after Argo's substitution)."""
    import yaml

    out = []
    for template in workflow["spec"]["templates"]:
        manifest = (template.get("resource") or {}).get("manifest") or ""
        if "kind: JobSet" not in manifest and '"kind": "JobSet"' not in manifest:
            continue
        values = _argo_values(workflow, nodes, uuid.uuid4().hex[:6], step=template["name"])
        out.append((template["name"], template, _prune_nulls(yaml.safe_load(_substitute(manifest, values)))))
    return out


def _through_client_models(pod_template):
    """The pod template read into the kubernetes client's V1PodTemplateSpec and
    written back: equal only if every field is one the client knows, typed so."""
    from kubernetes.client import ApiClient

    class Response:
        data = json.dumps(pod_template)

    api = ApiClient()
    model = api.deserialize(Response(), "V1PodTemplateSpec")
    assert _prune_nulls(api.sanitize_for_serialization(model)) == pod_template
    return model


# Every example as shipped (examples/checkpoint has its own @retry), and the
# Kubernetes example with `--with retry` too: one compile each, ~7 s apiece.
CASES = [(f, False) for f in EXAMPLES] + [(os.path.join(REPO, "examples", "kubernetes", "flow.py"), True)]


@pytest.mark.parametrize("flow, retry", CASES, ids=[
    os.path.basename(os.path.dirname(f)) + ("-with-retry" if r else "") for f, r in CASES])
def test_every_example_compiles_to_a_valid_jobset(flow, retry, tmp_path, moto):  # noqa: F811
    proc = _compile(moto, str(tmp_path), flow, retry)
    example = os.path.basename(os.path.dirname(flow))
    if example == "batch":
        # Argo runs every step on Kubernetes: Metaflow refuses a @batch step there.
        assert proc.returncode != 0
        assert "marked for execution both on AWS Batch and Kubernetes" in proc.stdout + proc.stderr
        return
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    workflow = json.loads(proc.stdout)
    jobsets = _jobsets(workflow)
    assert len(jobsets) == 1, [j[0] for j in jobsets]
    step, template, manifest = jobsets[0]
    validate_jobset(manifest)
    assert "startupPolicy" not in manifest["spec"] and "failurePolicy" not in manifest["spec"]
    if retry or example == "checkpoint":  # @retry(times=2) either way: Argo retries the whole JobSet
        assert int(template["retryStrategy"]["limit"]) == 2
    else:
        assert "retryStrategy" not in template
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod_template = rjob["template"]["spec"]["template"]
        model = _through_client_models(pod_template)
        assert model.spec.termination_grace_period_seconds == 0
        (container,) = model.spec.containers
        port = 29500 if example == "kubernetes" else None
        assert [p.container_port for p in container.ports or []] == ([port] if port else [])
    for _rjob, _index, _pod, env in _pods(manifest):
        assert all(var in env for var in K8S_VARS), sorted(env)
