"""What each node of a multi-node step is given on Kubernetes and on AWS Batch,
taken from Metaflow's own code at test time, not written down from memory.

Kubernetes: ``Kubernetes.create_jobset()`` (metaflow/plugins/kubernetes/kubernetes.py)
builds the JobSet that ``run --with kubernetes`` submits. We call it with a
client that never loads a kube config, dump the manifest and read, for the
control and the worker replicated jobs: the environment (MF_MASTER_ADDR,
MF_MASTER_PORT, MF_WORLD_SIZE, MF_CONTROL_INDEX, MF_PARALLEL_CONTROL_TASK_ID,
UBF_CONTEXT, and MF_WORKER_REPLICA_INDEX from the ``job-index`` annotation) and
the per-pod part of the step command (``--ubf-context ... --split-index ...
--task-id ...``, a bash fragment expanded with the pod's environment), and the
pod's subdomain and setHostnameAsFQDN. What the JobSet controller and kubelet
add is emulated: the ``job-index`` annotation (0 for the control, 0..N-2 for the
workers) and the pod name ``<jobset>-<job>-<i>-0``, whose FQDN in the subdomain
is what MF_MASTER_ADDR points at for the control.

AWS Batch: ``BatchJob.execute()`` (metaflow/plugins/aws/batch/batch_client.py)
turns the control's command and environment into per-node overrides of a
multi-node parallel job (``--split-index``, the ``-node-<i>`` task ids,
``ubf_task`` on the secondaries, MF_PARALLEL_CONTROL_TASK_ID). We call it with a
client that records the ``submit_job`` payload. What the Batch service adds is
emulated: AWS_BATCH_JOB_NUM_NODES, AWS_BATCH_JOB_NODE_INDEX,
AWS_BATCH_JOB_MAIN_NODE_INDEX, and AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS on
every node but the main one (the names ``_setup_multinode_environment`` in
batch_decorator.py reads).

Deliberately not passed to the nodes: METAFLOW_KUBERNETES_WORKLOAD and
AWS_BATCH_JOB_ID. Each only gates bookkeeping in the compute decorator's
task_pre_step (pod / job metadata, log and spot-termination sidecars) that
calls cloud metadata endpoints, which must not be contacted from here; neither
takes part in the multi-node set-up. Code-package, datastore and service
variables are left out too: the nodes run the checkout and share a local
datastore directory.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK

_BEGIN, _END = "MFTRSTEPOPTS<", ">MFTRSTEPOPTS"

# The environment of a pod that takes part in the multi-node contract.
KUBERNETES_VARS = (
    "METAFLOW_RUNTIME_ENVIRONMENT",
    "MF_MASTER_ADDR",
    "MF_MASTER_PORT",
    "MF_WORLD_SIZE",
    "MF_WORKER_REPLICA_INDEX",
    "MF_CONTROL_INDEX",
    "MF_PARALLEL_CONTROL_TASK_ID",
    "UBF_CONTEXT",
    "JOBSET_RESTART_ATTEMPT",
    "METAFLOW_KUBERNETES_JOBSET_NAME",
)
BATCH_VARS = ("METAFLOW_RUNTIME_ENVIRONMENT", "MF_PARALLEL_CONTROL_TASK_ID")


@dataclass
class NodeSpec:
    """One node as the platform starts it."""

    node_index: int  # what Metaflow should compute for current.parallel.node_index
    task_id: str
    ubf_context: str
    step_options: List[str]  # --ubf-context/--split-index/--task-id, as the platform passes them
    env: Dict[str, str]
    hostname: str
    aliases: List[str] = field(default_factory=list)  # e.g. the pod's FQDN

    @property
    def is_control(self) -> bool:
        return self.ubf_context == UBF_CONTROL


@dataclass
class Contract:
    platform: str  # "kubernetes" or "batch"
    decospec: str  # what the node's step command carries in --with
    nodes: List[NodeSpec]
    master_name: Optional[str] = None  # Kubernetes: the DNS name in MF_MASTER_ADDR
    control_task_id: str = ""


def _expand(fragment: str, env: Dict[str, str]) -> List[str]:
    """Expand a bash fragment of Metaflow's command with a node's environment, as
    the pod's / container's shell would."""
    proc = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + fragment],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True, text=True, timeout=10, check=True,
    )
    return [a for a in proc.stdout.split("\0") if a]


def _fragment(command: Sequence[str]) -> str:
    text = " ".join(command)
    start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
    return text[start:end].strip()


# ---------------------------------------------------------------- Kubernetes


def kubernetes_manifest(num_nodes: int, task_id: str, port: Optional[int], run_id: str = "1",
                        flow_name: str = "Flow", step_name: str = "train",
                        namespace: str = "default") -> Dict:
    """The JobSet ``run --with kubernetes`` would submit for a @parallel step."""
    from metaflow.plugins.kubernetes import kubernetes_client
    from metaflow.plugins.kubernetes.kubernetes import (
        METAFLOW_PARALLEL_STEP_CLI_OPTIONS_TEMPLATE,
        Kubernetes,
    )

    class _OfflineClient(kubernetes_client.KubernetesClient):
        def _refresh_client(self):  # no kube config, no API server
            from kubernetes import client

            self._client = client
            self._client_refresh_timestamp = time.time()

    class _Datastore:
        TYPE = "s3"

    class _Environment:
        def get_package_commands(self, *args, **kwargs):
            return ["true"]

        def bootstrap_commands(self, *args, **kwargs):
            return []

    original = kubernetes_client.KubernetesClient
    import metaflow.plugins.kubernetes.kubernetes as k8s_module

    k8s_module.KubernetesClient = _OfflineClient
    try:
        jobset = Kubernetes(datastore=_Datastore(), metadata=None, environment=_Environment()).create_jobset(
            flow_name=flow_name, run_id=run_id, step_name=step_name, task_id=task_id, attempt="0",
            user="harness", code_package_metadata="", code_package_sha="", code_package_url="",
            code_package_ds="s3", docker_image="python:3.11", docker_image_pull_policy=None,
            step_cli="%s %s %s" % (_BEGIN, METAFLOW_PARALLEL_STEP_CLI_OPTIONS_TEMPLATE, _END),
            namespace=namespace, cpu="1", memory="4096", disk="10240", gpu=None,
            gpu_vendor="nvidia", run_time_limit=3600, env={}, port=port,
            num_parallel=num_nodes, shared_memory=None, qos="Burstable",
        )
        manifest = jobset.dump()
    finally:
        k8s_module.KubernetesClient = original
    manifest["_control_addr"] = jobset.jobset_control_addr
    return manifest


_ANNOTATION = re.compile(r"metadata\.annotations\['jobset\.sigs\.k8s\.io/([a-z-]+)'\]")


def kubernetes(num_nodes: int, task_id: str, port: Optional[int], run_id: str = "1",
               flow_name: str = "Flow", step_name: str = "train") -> Contract:
    manifest = kubernetes_manifest(num_nodes, task_id, port, run_id, flow_name, step_name)
    jobset = manifest["metadata"]["name"]
    master = manifest["_control_addr"]
    domain = master.split(".", 1)[1]  # <subdomain>.<namespace>.svc.cluster.local
    nodes: List[NodeSpec] = []
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        for job_index in range(rjob["replicas"]):
            # What the JobSet controller annotates each pod with.
            annotations = {"job-index": str(job_index), "restart-attempt": "0", "jobset-name": jobset}
            env: Dict[str, str] = {}
            for var in container["env"]:
                if var["name"] not in KUBERNETES_VARS:
                    continue
                if "value" in var:
                    env[var["name"]] = str(var["value"])
                else:
                    m = _ANNOTATION.fullmatch(var["valueFrom"]["fieldRef"]["fieldPath"])
                    env[var["name"]] = annotations[m.group(1)]
            options = _expand(_fragment(container["command"]), env)
            # The JobSet controller names pods <jobset>-<job>-<job index>-<pod
            # index>; with the pod's subdomain that gives the FQDN kubelet writes
            # into the pod's /etc/hosts, and with setHostnameAsFQDN the FQDN is
            # the pod's host name.
            short = "%s-%s-%d-0" % (jobset, rjob["name"], job_index)
            fqdn = "%s.%s.%s" % (short, pod["subdomain"], domain.split(".", 1)[1])
            as_fqdn = bool(pod.get("setHostnameAsFQDN"))
            nodes.append(
                NodeSpec(
                    node_index=0 if rjob["name"] == "control" else job_index + 1,
                    task_id=options[options.index("--task-id") + 1],
                    ubf_context=options[options.index("--ubf-context") + 1],
                    step_options=options,
                    env=env,
                    hostname=fqdn if as_fqdn else short,
                    aliases=[fqdn, short] if as_fqdn else [fqdn],
                )
            )
    nodes.sort(key=lambda n: n.node_index)
    return Contract(
        platform="kubernetes", decospec="kubernetes", nodes=nodes, master_name=master,
        control_task_id=task_id,
    )


# ----------------------------------------------------------------- AWS Batch


def batch_payload(num_nodes: int, task_id: str) -> Dict:
    """The ``submit_job`` payload of a multi-node parallel job for the control
    task ``task_id`` (batch_cli.py puts ``--task-id``, ``--ubf-context`` and the
    ``[multinode-args]`` placeholder in the step command; batch.py sets
    METAFLOW_RUNTIME_ENVIRONMENT)."""
    from metaflow.plugins.aws.batch.batch_client import BatchJob

    recorded: Dict = {}

    class _RecordingClient:
        def submit_job(self, **payload):
            recorded.update(payload)
            return {"jobId": "harness"}

        def describe_jobs(self, jobs):
            return {"jobs": [{"jobId": j, "status": "SUBMITTED"} for j in jobs]}

    job = BatchJob(_RecordingClient()).image("python:3.11").iam_role("harness").task_id(task_id)
    job.num_parallel = num_nodes
    job.command(["bash", "-c", "%s --task-id %s --ubf-context %s [multinode-args] %s"
                 % (_BEGIN, task_id, UBF_CONTROL, _END)])
    job.environment_variable("METAFLOW_RUNTIME_ENVIRONMENT", "aws-batch")
    job.execute()
    return recorded


def batch(num_nodes: int, task_id: str, ips: Sequence[str]) -> Contract:
    payload = batch_payload(num_nodes, task_id)
    nodes: List[NodeSpec] = []
    for override in payload["nodeOverrides"]["nodePropertyOverrides"]:
        first, last = (int(x) for x in override["targetNodes"].split(":"))
        container = override["containerOverrides"]
        base = {e["name"]: str(e["value"]) for e in container["environment"] if e["name"] in BATCH_VARS}
        for index in range(first, last + 1):
            # What the Batch service sets in every node's container.
            env = dict(base)
            env["AWS_BATCH_JOB_NUM_NODES"] = str(num_nodes)
            env["AWS_BATCH_JOB_NODE_INDEX"] = str(index)
            env["AWS_BATCH_JOB_MAIN_NODE_INDEX"] = "0"
            if index != 0:
                env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = ips[0]
            options = _expand(_fragment(container["command"]), env)
            hostname = "ip-%s" % ips[index].replace(".", "-")  # EC2's naming
            nodes.append(
                NodeSpec(
                    node_index=index,
                    task_id=options[options.index("--task-id") + 1],
                    ubf_context=options[options.index("--ubf-context") + 1],
                    step_options=options,
                    env=env,
                    hostname=hostname,
                    aliases=["%s.ec2.internal" % hostname],
                )
            )
    nodes.sort(key=lambda n: n.node_index)
    return Contract(platform="batch", decospec="batch", nodes=nodes, control_task_id=task_id)


__all__ = ["Contract", "NodeSpec", "kubernetes", "batch", "UBF_CONTROL", "UBF_TASK"]
