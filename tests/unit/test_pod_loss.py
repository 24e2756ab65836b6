"""A @torchrun step that can go on without a node gets its lost worker pods back on Kubernetes:
launch/pod_loss.py (pure) and kubernetes_spec.py (Metaflow's JobSet builder, wrapped).

The wrapping is process-wide, so the Metaflow side runs in a child process that builds the JobSets
with the installed Metaflow's own classes (KubernetesJobSet for ``run``, KubernetesArgoJobSet for Argo
Workflows where it exists). The compiled flows are tests/multihost/test_submitted.py's.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.launch import pod_loss

RULE = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def _job(name: str = "worker", container: str = "train-model", restart: str = "Never", **job) -> dict:
    pod = {"containers": [{"name": container, "command": ["true"]}], "restartPolicy": restart}
    return {"name": name, "replicas": 2,
            "template": {"metadata": {}, "spec": dict({"backoffLimit": 0, "template": {"spec": pod}}, **job)}}


@pytest.mark.parametrize("spares,min_nodes,wanted", [
    (0, None, False), (None, None, False), (1, None, True), (0, 2, True), (3, 1, True), (-1, None, False),
    ("1", None, False),  # an unread attribute is not a count: the step's spec reads it first
])
def test_which_steps_want_lost_pods_back(spares, min_nodes, wanted):
    assert pod_loss.wants_lost_pods_back(spares, min_nodes) is wanted


def test_the_worker_job_of_a_registered_step_gets_the_rule_and_nothing_else_changes():
    job = _job()
    before = copy.deepcopy(job)
    out = pod_loss.with_lost_workers_back(job, ["train_model"])  # the flow's spelling, "_" -> "-" in the pod
    assert job == before  # never changed in place
    assert out["template"]["spec"].pop("podFailurePolicy") == {"rules": [RULE]}
    assert out == before


@pytest.mark.parametrize("job,steps", [
    (_job(name="control"), ["train_model"]),  # the control holds the gang: its loss ends the step
    (_job(), ["train"]),  # another step's JobSet
    (_job(), []),
    (_job(restart="OnFailure"), ["train_model"]),  # Kubernetes refuses the policy with it
    ({"name": "worker", "template": None}, ["train_model"]),
    ({"name": "worker", "template": {"spec": {"template": {"spec": {"containers": [
        {"name": "train-model"}, {"name": "sidecar"}]}}}}}, ["train_model"]),  # not one of Metaflow's
])
def test_any_other_job_comes_back_as_it_was(job, steps):
    assert pod_loss.with_lost_workers_back(job, steps) == job


def test_rules_already_there_are_kept_after_ours_and_ours_is_never_doubled():
    theirs = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}
    job = _job(podFailurePolicy={"rules": [theirs, RULE]})
    out = pod_loss.with_lost_workers_back(job, ["train_model"])
    assert out["template"]["spec"]["podFailurePolicy"]["rules"] == [RULE, theirs]
    assert pod_loss.with_lost_workers_back(out, ["train_model"]) == out


def test_the_rule_survives_the_kubernetes_job_models():
    """What the Job API keeps: the spec read into the client's V1JobSpec and written back loses nothing."""
    k8s = pytest.importorskip("kubernetes.client")
    spec = pod_loss.with_lost_workers_back(_job(), ["train_model"])["template"]["spec"]
    api = k8s.ApiClient()
    model = api._ApiClient__deserialize(spec, "V1JobSpec")
    assert isinstance(model.pod_failure_policy, k8s.V1PodFailurePolicy)
    (rule,) = model.pod_failure_policy.rules
    assert (rule.action, rule.on_exit_codes) == ("Ignore", None)
    assert [(c.type, c.status) for c in rule.on_pod_conditions] == [("DisruptionTarget", "True")]
    assert model.template.spec.restart_policy == "Never"
    assert api.sanitize_for_serialization(model) == spec


BUILD = r'''
import json, sys
from kubernetes import client
from metaflow.plugins.kubernetes import kubernetes_jobsets as js
from metaflow_extensions.torchrun.plugins.torchrun import kubernetes_spec

class Spec:
    spares, min_nodes = int(sys.argv[1]), (None if sys.argv[2] == "-" else int(sys.argv[2]))

class Client:
    def get(self):
        return client

registered = kubernetes_spec.keep_lost_workers("train_model", json.loads(sys.argv[3]), Spec())
out = {"registered": registered}
if hasattr(js, "JobSetSpec"):  # Metaflow 2.12.9+: one builder per replicated job, for run and Argo
    import yaml
    kw = dict(step_name="train_model", command=["true"], image="python:3.11", image_pull_policy=None,
              image_pull_secrets=[], service_account=None, secrets=[], node_selector=None, cpu="1",
              memory="4096", disk="10240", gpu=None, gpu_vendor="nvidia", timeout_in_seconds=60,
              use_tmpfs=False, tmpfs_size=None, tmpfs_path=None, tmpfs_tempdir=None,
              persistent_volume_claims=None, shared_memory=None, port=None, qos="Burstable",
              tolerations=[], labels={}, annotations={}, retries=0, subdomain="js-1")
    argo = js.KubernetesArgoJobSet(client, name="js-1", namespace="ns", **kw)
    run = js.KubernetesJobSet(Client(), name="js-1", namespace="ns", num_parallel=3, **kw)
    for made in (argo, run):
        made.control.replicas(1)
        made.worker.replicas(2)
    out["argo"], out["run"] = yaml.safe_load(argo.dump()), run.dump()
else:  # before: the whole manifest made in KubernetesJobSet.__init__ (no JobSet for Argo)
    pod = client.V1PodSpec(containers=[client.V1Container(name="train-model", command=["true"], env=[])],
                           restart_policy="Never")
    job = client.V1JobSpec(template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(), spec=pod))
    out["run"] = js.KubernetesJobSet(Client(), name="js-1", job_spec=job, namespace="ns", num_parallel=3,
                                     annotations={}, labels={}, port=None, task_id="t-1")._jobset
print(json.dumps(out, default=str))
'''


def _built(spares: int, min_nodes, decorators=("kubernetes",)) -> dict:
    pytest.importorskip("kubernetes.client")
    pytest.importorskip("yaml")
    specs = json.dumps([[name, {}] for name in decorators])
    proc = subprocess.run([sys.executable, "-c", BUILD, str(spares), "-" if min_nodes is None else str(min_nodes),
                           specs], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _policies(manifest: dict) -> dict:
    return {r["name"]: r["template"]["spec"].get("podFailurePolicy") for r in manifest["spec"]["replicatedJobs"]}


@pytest.mark.parametrize("spares,min_nodes", [(1, None), (0, 2)])
def test_metaflows_own_jobsets_of_a_step_with_spares_or_min_nodes_get_the_rule(spares, min_nodes):
    got = _built(spares, min_nodes)
    assert got.pop("registered") is True
    assert got  # at least the JobSet of `run`
    for manifest in got.values():
        assert _policies(manifest) == {"control": None, "worker": {"rules": [RULE]}}
        # Complete with the control Job, not with a worker pod that may never come back.
        assert manifest["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["control"]}


@pytest.mark.parametrize("spares,min_nodes,decorators", [
    (0, None, ("kubernetes",)),  # nothing to go on with
    (1, None, ("batch",)),  # not on Kubernetes: nothing of Metaflow's Kubernetes code is touched
])
def test_metaflows_own_jobsets_of_any_other_step_are_left_alone(spares, min_nodes, decorators):
    got = _built(spares, min_nodes, decorators)
    assert got.pop("registered") is False
    for manifest in got.values():
        assert _policies(manifest) == {"control": None, "worker": None}
        assert manifest["spec"].get("successPolicy") is None  # every Job, as Metaflow wrote it


def _jobset(*jobs: dict) -> dict:
    return {"kind": "JobSet", "spec": {"replicatedJobs": list(jobs), "successPolicy": None}}


def test_the_jobset_of_a_registered_step_completes_with_its_control_job():
    jobset = _jobset(_job(name="control"), _job())
    before = copy.deepcopy(jobset)
    out = pod_loss.with_control_success(jobset, ["train_model"])
    assert jobset == before  # never changed in place
    assert out["spec"].pop("successPolicy") == {"operator": "All", "targetReplicatedJobs": ["control"]}
    before["spec"].pop("successPolicy")
    assert out == before
    other = _jobset(_job(name="control"), _job(container="train"))  # another step's
    assert pod_loss.with_control_success(other, ["train_model"]) == other


ARGO_YAML = """apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
spec:
  replicatedJobs:
  - name: worker
    replicas: {{=asInt(inputs.parameters.workerCount)}}
  startupPolicy: null
  successPolicy: null
  suspend: false
"""


def test_the_argo_jobsets_text_gets_the_same_policy_where_its_line_is_there_once():
    yaml = pytest.importorskip("yaml")
    out = pod_loss.yaml_with_control_success(ARGO_YAML)
    assert "{{=asInt(inputs.parameters.workerCount)}}" in out  # Argo's template left as it was
    read = yaml.safe_load(out.replace("{{=asInt(inputs.parameters.workerCount)}}", "2"))
    assert read["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["control"]}
    assert read["spec"]["suspend"] is False and read["spec"]["startupPolicy"] is None
    for text in (ARGO_YAML.replace("  successPolicy: null\n", ""), ARGO_YAML + "  successPolicy: null\n"):
        assert pod_loss.yaml_with_control_success(text) == text


def test_the_control_ends_once_the_others_tasks_are_stored_or_its_wait_is_over(tmp_path, capfd):
    """Its JobSet completes with its Job and then deletes the others: runtime/step_run.py's wait, on a real
    local datastore (Metaflow's done marker of the attempt), with a clock of its own."""
    import os

    from metaflow.datastore import FlowDataStore
    from metaflow.plugins.datastores.local_storage import LocalStorage

    from metaflow_extensions.torchrun.plugins.torchrun.runtime import step_run

    storage = FlowDataStore("TrainFlow", storage_impl=LocalStorage, ds_root=str(tmp_path))._storage_impl
    tasks = {1: "7/train/t-worker-0", 2: "7/train/t-worker-1"}
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 1.0:  # node 1's task stores its artifacts a second in; node 2's never does
            done = storage.full_uri(storage.path_join("TrainFlow", tasks[1], "3.DONE.lock"))
            os.makedirs(os.path.dirname(done), exist_ok=True)
            open(done, "w").close()

    left = step_run.wait_for_tasks_stored(storage, "TrainFlow", tasks, 3, 10.0, clock=lambda: now[0], sleep=sleep)
    assert left == [2] and now[0] >= 10.0
    said = "".join(capfd.readouterr())
    assert said.count("waiting for node 2's task to store its artifacts") == 1, said  # node 1's stored by then
    assert "node 2's task had not stored its artifacts after 10s" in said, said
    assert step_run.wait_for_tasks_stored(storage, "TrainFlow", {1: tasks[1]}, 3, 10.0, clock=lambda: 99.0,
                                          sleep=sleep) == []
