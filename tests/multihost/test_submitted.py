"""What Metaflow submits for a ``@torchrun`` step, captured through Metaflow's own
code with no cluster (issue #5, item 3).

Kubernetes: ``python flow.py argo-workflows create --only-json`` prints the Argo
WorkflowTemplate; the ``train`` template holds the JobSet as a YAML string with
Argo placeholders. We substitute them as Argo would (from the DAG task's own
argument expressions), prune nulls as the API server does for a CRD whose
schema has no ``nullable``, validate against the JobSet CRD's openAPIV3Schema
(``/work/shared/k8s/jobset-crd.yaml``, or MFTR_JOBSET_CRD), refuse fields the
API server would silently prune, and check what ``@torchrun`` relies on. In
``--only-json`` mode Metaflow skips the token lookup and the metadata service
check, so nothing reads a kube config: the flows run with KUBECONFIG pointing at
a missing file and no in-cluster variables, and nothing is patched. The only
service needed is S3 for the code package: moto's server on 127.0.0.1.

AWS Batch: ``python flow.py run`` with ``@batch`` on ``train``, every AWS call
sent to the same moto server (``AWS_ENDPOINT_URL``) with moto's Docker-less
Batch (``{"batch": {"use_docker": false}}``): ``start`` runs here, then
Metaflow's runtime launches ``batch step train``, which registers the
multi-node job definition and submits the job exactly as on AWS. moto marks the
job SUCCEEDED without running it, so the run then fails (the task wrote
nothing); that is expected. The job definition and job are read back with
boto3, but moto's DescribeJobDefinitions leaves ``nodeProperties`` out and its
SubmitJob drops ``nodeOverrides`` (each node's command, environment and GPUs
live there), so the requests themselves are read from moto's request recorder,
switched on around each Batch run.

The server is started once for this module and stopped (then killed) at the
end; every flow run must leave no process behind.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Dict, List, Optional, Tuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOW = os.path.join(REPO, "tests", "flows", "submit_flow.py")
CRD = os.environ.get("MFTR_JOBSET_CRD", "/work/shared/k8s/jobset-crd.yaml")
BUCKET = "mftr-submitted"
QUEUE = "mftr-mnp-queue"
REGION = "us-east-1"
NAMESPACE = "mftr-ns"  # not "default", so a namespace mix-up shows

# What @torchrun (and Metaflow's own current.parallel) read on a JobSet pod.
K8S_VARS = ("MF_MASTER_ADDR", "MF_MASTER_PORT", "MF_WORLD_SIZE", "MF_PARALLEL_CONTROL_TASK_ID",
            "UBF_CONTEXT", "METAFLOW_RUNTIME_ENVIRONMENT")


# ------------------------------------------------------------------ moto server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, data: Optional[bytes] = None, timeout: float = 5.0) -> bytes:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


class Moto:
    def __init__(self, directory: str):
        self.dir = directory
        self.recording = os.path.join(directory, "moto-recording.jsonl")
        self.log = open(os.path.join(directory, "moto.log"), "wb")
        self.port = _free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        env = dict(os.environ, MOTO_RECORDER_FILEPATH=self.recording)
        env.pop("MOTO_ENABLE_RECORDING", None)  # recorded on demand: see record()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                _http(self.url + "/moto-api/config")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start:\n" + self.log_text())
                time.sleep(0.1)

    def log_text(self) -> str:
        with open(os.path.join(self.dir, "moto.log"), "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def client(self, service: str):
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def record(self, on: bool) -> None:
        """Start recording requests afresh, or stop."""
        if on:
            _http(self.url + "/moto-api/recorder/reset-recording", b"")
        _http(self.url + "/moto-api/recorder/%s-recording" % ("start" if on else "stop"), b"")

    def recorded(self) -> List[Dict]:
        """The requests moto recorded, bodies decoded."""
        out = []
        if not os.path.exists(self.recording):
            return out
        with open(self.recording, "rb") as f:
            for line in f:
                entry = json.loads(line)
                body = entry.get("body") or ""
                if entry.get("body_encoded"):
                    body = base64.b64decode(body).decode("utf-8", errors="replace")
                entry["body"] = body
                out.append(entry)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    pytest.importorskip("moto")
    server = Moto(str(tmp_path_factory.mktemp("moto")))
    try:
        server.client("s3").create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()
    assert server.proc.returncode is not None


@pytest.fixture(scope="module")
def batch_queue(moto):
    """A job queue on a managed EC2 compute environment (Metaflow reads the
    compute environment's platform to build the job definition)."""
    _http(moto.url + "/moto-api/config", json.dumps({"batch": {"use_docker": False}}).encode())
    iam, ec2, batch = moto.client("iam"), moto.client("ec2"), moto.client("batch")
    role = iam.create_role(RoleName="mftr-batch-job", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    profile = iam.create_instance_profile(InstanceProfileName="mftr-ecs")["InstanceProfile"]["Arn"]
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="mftr", Description="mftr", VpcId=vpc)["GroupId"]
    env = batch.create_compute_environment(
        computeEnvironmentName="mftr-ce", type="MANAGED", state="ENABLED", serviceRole=role,
        computeResources={"type": "EC2", "minvCpus": 0, "maxvCpus": 64, "desiredvCpus": 0,
                          "instanceTypes": ["optimal"], "subnets": [subnet],
                          "securityGroupIds": [group], "instanceRole": profile},
    )["computeEnvironmentArn"]
    batch.create_job_queue(jobQueueName=QUEUE, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env}])
    return role


def _flow_env(moto: Moto, tmp: str, platform: str, attrs: Dict, nodes: int,
              resources: Optional[Dict] = None, extra: Optional[Dict] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "METAFLOW_", "KUBERNETES_", "MFTR_"))}
    env.update({
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        "HOME": env.get("HOME", tmp),
        "PYTHONUNBUFFERED": "1",
        # AWS: everything goes to moto; no profile or credentials file is read.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": moto.url,
        "AWS_CONFIG_FILE": os.path.join(tmp, "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.path.join(tmp, "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        # Kubernetes: no kube config anywhere, not in a cluster.
        "KUBECONFIG": os.path.join(tmp, "no-kube-config"),
        # Metaflow: no user config; S3 datastore on moto, local metadata.
        "METAFLOW_HOME": os.path.join(tmp, "mfhome"),
        "METAFLOW_USER": "tests",
        "METAFLOW_DEFAULT_DATASTORE": "s3",
        "METAFLOW_DATASTORE_SYSROOT_S3": "s3://%s/%s" % (BUCKET, uuid.uuid4().hex[:8]),
        "METAFLOW_S3_ENDPOINT_URL": moto.url,
        "METAFLOW_DEFAULT_METADATA": "local",
        "METAFLOW_DATASTORE_SYSROOT_LOCAL": tmp,
        "METAFLOW_KUBERNETES_NAMESPACE": NAMESPACE,
        "MFTR_SUBMIT_PLATFORM": platform,
        "MFTR_SUBMIT_ATTRS": json.dumps(attrs),
        "MFTR_SUBMIT_NODES": str(nodes),
        "MFTR_SUBMIT_RESOURCES": json.dumps(resources),
    })
    env.update(extra or {})
    return env


TOKEN_VAR = "MFTR_SUBMIT_TOKEN"


def _with_token(token: str) -> List[int]:
    """Live processes whose environment carries ``token``."""
    needle = ("%s=%s" % (TOKEN_VAR, token)).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open("/proc/%s/stat" % pid, "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _run_flow(env: Dict[str, str], tmp: str, *args: str, timeout: float = 120,
              flow: str = FLOW) -> subprocess.CompletedProcess:
    """Run the flow; fail if any process it started is still alive afterwards."""
    token = uuid.uuid4().hex
    try:
        return subprocess.run(
            [sys.executable, flow, "--no-pylint", *args], cwd=tmp, env=dict(env, **{TOKEN_VAR: token}),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )
    finally:
        deadline = time.monotonic() + 5
        left = _with_token(token)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _with_token(token)
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        assert not left, "processes left behind: %s" % left


def _expand(fragment: str, env: Dict[str, str], prelude: str = "") -> List[str]:
    """Expand a fragment of a submitted bash command as the container's shell would."""
    proc = subprocess.run(
        ["bash", "-c", prelude + "printf '%s\\0' " + fragment],
        env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=10,
    )
    assert proc.returncode == 0, proc.stderr
    return [a for a in proc.stdout.split("\0") if a]


def _option(argv: List[str], name: str) -> str:
    """The value click sees for an option given several times: the last one."""
    values = [argv[i + 1] for i, a in enumerate(argv) if a == name]
    assert values, "%s not in %s" % (name, argv)
    return values[-1]


def _step_fragment(script: str) -> str:
    """The ``step train ...`` options inside the task's bash command."""
    m = re.search(r"\bstep train (.*?)\)\s+1>>", script)
    assert m, "no 'step train' command in:\n" + script
    return m.group(1)


def _extension():
    from metaflow_extensions.torchrun.plugins.torchrun.gang import identity, ports, topology
    from metaflow_extensions.torchrun.plugins.torchrun.launch import resources

    return resources, identity, topology, ports


# ------------------------------------------------------------------- Kubernetes


@functools.lru_cache(maxsize=None)
def _crd_validators() -> Dict:
    """Served version -> (schema, validator), from the CRD file."""
    import jsonschema
    import yaml

    if not os.path.exists(CRD):
        pytest.skip("JobSet CRD not found at %s (set MFTR_JOBSET_CRD)" % CRD)
    with open(CRD) as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["group"] == "jobset.x-k8s.io" and crd["spec"]["names"]["kind"] == "JobSet"
    out = {}
    for version in crd["spec"]["versions"]:
        if version.get("served"):
            schema = version["schema"]["openAPIV3Schema"]
            # OpenAPI 3.0 schema objects are JSON Schema draft 4 (x-kubernetes-* are ignored).
            jsonschema.Draft4Validator.check_schema(schema)
            out[version["name"]] = (schema, jsonschema.Draft4Validator(schema))
    return out


def _prune_nulls(value):
    """The API server drops null fields whose schema is not ``nullable`` (the JobSet
    CRD marks none) before validating."""
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


def _pruned_fields(value, schema: Dict, path: str = "") -> List[str]:
    """Fields the API server would silently drop (not in a structural schema)."""
    out: List[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string"):
        return out
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and extra is None:
            if path != "/metadata":  # the root ObjectMeta is the API server's own
                out.extend("%s/%s" % (path, k) for k in value)
            return out
        for key, item in value.items():
            sub = (props or {}).get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                out.append("%s/%s" % (path, key))
            else:
                out.extend(_pruned_fields(item, sub, "%s/%s" % (path, key)))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out.extend(_pruned_fields(item, schema["items"], "%s[%d]" % (path, i)))
    return out


def validate_jobset(manifest: Dict) -> None:
    """Validate like the API server would on create (CEL rules aside: the only
    one that applies on create is checked by hand)."""
    validators = _crd_validators()
    group, version = manifest["apiVersion"].split("/")
    assert group == "jobset.x-k8s.io" and manifest["kind"] == "JobSet"
    assert version in validators, "JobSet %s is not served by this CRD (%s)" % (version, list(validators))
    schema, validator = validators[version]
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))
    assert not errors, "\n".join("%s: %s" % ("/".join(map(str, e.path)), e.message) for e in errors)
    pruned = _pruned_fields(manifest, schema)
    assert not pruned, "the API server would drop: %s" % pruned
    spec = manifest["spec"]
    # x-kubernetes-validations on /spec: StartupPolicy InOrder excludes dependsOn.
    assert not ((spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
                and any("dependsOn" in r for r in spec["replicatedJobs"]))


def _argo_values(workflow: Dict, num_parallel: int, entropy: str, step: str = "train") -> Dict[str, str]:
    """The values Argo gives the ``train`` resource template's placeholders, from
    the DAG task that calls it (its argument expressions evaluated as Argo would:
    only the forms Metaflow 2.19 writes are known; anything else fails)."""
    caller_inputs = {
        "num-parallel": str(num_parallel),
        "task-id-entropy": entropy,
        "input-paths": "argo-submitflow-x7k2p/start/t-0a1b2c3d",
        "split-index": "0",
    }
    calls = [task for t in workflow["spec"]["templates"] if "dag" in t
             for task in t["dag"]["tasks"] if task.get("template") == step]
    assert len(calls) == 1, calls
    values = {"workflow.name": "submitflow-x7k2p"}
    for param in calls[0]["arguments"]["parameters"]:
        raw = param["value"]
        if raw == "{{=sprig.int(sprig.sub(sprig.int(inputs.parameters['num-parallel']),1))}}":
            value = str(int(caller_inputs["num-parallel"]) - 1)
        else:
            value = re.sub(r"\{\{inputs\.parameters\.([\w-]+)\}\}", lambda m: caller_inputs[m.group(1)], raw)
            value = value.replace("{{retries}}", "0")  # Argo's retry count, under @retry: the first attempt
        assert "{{" not in value, "unknown Argo expression %r" % raw
        values["inputs.parameters." + param["name"]] = value
    return values


def _substitute(text: str, values: Dict[str, str]) -> str:
    def one(m):
        expr = m.group(1)
        asint = re.fullmatch(r"=asInt\(([\w.-]+)\)", expr)
        if asint:
            return str(int(values[asint.group(1)]))
        assert expr in values, "unknown Argo placeholder {{%s}}" % expr
        return values[expr]

    return re.sub(r"\{\{(.*?)\}\}", one, text)


def _pods(manifest: Dict) -> List[Tuple[str, int, Dict, Dict]]:
    """(replicated job, job index, pod spec, container env as the kubelet sets
    it) for every pod the JobSet makes; the JobSet controller's annotations and
    pod names are emulated as in contracts.py."""
    name = manifest["metadata"]["name"]
    pods = []
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]["spec"]
        namespace = rjob["template"]["spec"]["template"]["metadata"].get("namespace")
        (container,) = pod["containers"]
        for index in range(rjob["replicas"]):
            fields = {
                "metadata.annotations['jobset.sigs.k8s.io/job-index']": str(index),
                "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']": "0",
                "metadata.annotations['jobset.sigs.k8s.io/jobset-name']": name,
                "metadata.namespace": namespace,
                "metadata.name": "%s-%s-%d-0-abcde" % (name, rjob["name"], index),
                "metadata.uid": str(uuid.uuid4()),
                "spec.serviceAccountName": "default",
                "status.hostIP": "10.0.0.%d" % (len(pods) + 1),
            }
            env = {}
            for var in container["env"]:
                if "value" in var:
                    env[var["name"]] = var["value"]
                else:
                    env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
            pods.append((rjob["name"], index, pod, env))
    return pods


def argo_jobset(tmp_path, moto, attrs: Dict, nodes: int, resources: Optional[Dict] = None,
                torchrun: Optional[Dict] = None):
    """(workflow template, JobSet manifest after Argo's substitution, raw YAML)."""
    import yaml

    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "kubernetes", attrs, nodes, resources,
                    extra={"MFTR_SUBMIT_TORCHRUN": json.dumps(torchrun or {})})
    proc = _run_flow(env, tmp, "argo-workflows", "create", "--only-json", timeout=90)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workflow = json.loads(proc.stdout)
    assert workflow["kind"] == "WorkflowTemplate"
    (template,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train"]
    resource = template["resource"]
    assert resource["action"] == "create"
    values = _argo_values(workflow, nodes, uuid.uuid4().hex[:6])
    manifest = yaml.safe_load(_substitute(resource["manifest"], values))
    return workflow, _prune_nulls(manifest), resource["manifest"]


K8S_CASES = {
    # name: (@kubernetes attributes, num_parallel, @resources attributes)
    "gpu2-port29400": ({"gpu": 2, "port": 29400}, 2, None),
    "gpu2-noport-shm-3nodes": ({"gpu": 2, "shared_memory": 16384}, 3, None),
    "resources-gpu1-over-kubernetes-gpu2": ({"gpu": 2}, 2, {"gpu": 1}),
}


@pytest.mark.parametrize("case", list(K8S_CASES))
def test_kubernetes_jobset_from_argo_only_json(case, tmp_path, moto):
    attrs, nodes, resources = K8S_CASES[case]
    workflow, manifest, raw = argo_jobset(tmp_path, moto, attrs, nodes, resources)
    validate_jobset(manifest)

    # Replica layout: a control job of 1 and a worker job of num_parallel - 1.
    name = manifest["metadata"]["name"]
    assert re.fullmatch(r"js-[0-9a-f]{6}", name)
    layout = [(r["name"], r["replicas"]) for r in manifest["spec"]["replicatedJobs"]]
    assert layout == [("control", 1), ("worker", nodes - 1)]
    assert "{{=asInt(inputs.parameters.workerCount)}}" in raw  # an integer after Argo, not a string
    for rjob in manifest["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        assert (job["completions"], job["parallelism"], job["backoffLimit"]) == (1, 1, 0)
        assert "podFailurePolicy" not in job  # no spares, no min_nodes: a lost pod fails its Job, as Metaflow made it
    assert "successPolicy" not in manifest["spec"]  # and the JobSet completes with every Job, as Metaflow made it

    # No spec.network: JobSet's defaults (DNS hostnames on, a headless service
    # named after the JobSet) are what MF_MASTER_ADDR below relies on.
    assert "network" not in manifest["spec"]
    pods = _pods(manifest)
    assert len(pods) == nodes
    resources_mod, runner, topology, ports = _extension()
    decorators = [("kubernetes", attrs)] + ([("resources", resources)] if resources else [])
    accelerators = resources_mod.requested_accelerators(decorators)
    port = attrs.get("port")
    views = []
    for rjob, index, pod, env in pods:
        (container,) = pod["containers"]
        for var in K8S_VARS:
            assert var in env, "%s missing on %s-%d" % (var, rjob, index)
        assert env["METAFLOW_RUNTIME_ENVIRONMENT"] == "kubernetes"
        assert not topology.is_local_runtime(env)
        assert env["MF_WORLD_SIZE"] == str(nodes)
        # The control pod's FQDN: pod <jobset>-control-0-0 in the headless service
        # that JobSet names after the jobset (the pods' subdomain).
        assert pod["subdomain"] == name and pod["setHostnameAsFQDN"] is True
        assert env["MF_MASTER_ADDR"] == "%s-control-0-0.%s.%s.svc.cluster.local" % (name, name, NAMESPACE)
        assert workflow["metadata"]["namespace"] == NAMESPACE  # where Argo creates the JobSet
        assert env["UBF_CONTEXT"] == ("ubf_control" if rjob == "control" else "ubf_task")
        assert ("MF_CONTROL_INDEX" in env) == (rjob == "control")
        assert "MF_WORKER_REPLICA_INDEX" in env

        # GPUs: the limit Metaflow sets is what @torchrun derives nproc_per_node from.
        limits = container["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == str(accelerators.count)
        assert accelerators.nproc == int(limits["nvidia.com/gpu"])
        if resources:
            assert accelerators.nproc == resources["gpu"]  # @resources replaces @kubernetes's own
        else:
            assert accelerators.nproc == attrs["gpu"]

        # Ports.
        if port:
            assert container["ports"] == [{"containerPort": port}]
            assert env["MF_MASTER_PORT"] == str(port)
        else:
            assert not container.get("ports")
            assert env["MF_MASTER_PORT"] == "None"

        # Shared memory.
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        if attrs.get("shared_memory"):
            assert volumes[mounts["/dev/shm"]]["emptyDir"] == {
                "medium": "Memory", "sizeLimit": "%dMi" % attrs["shared_memory"]}
        else:
            assert "/dev/shm" not in mounts

        # The per-pod step options, as the pod's shell expands them.
        script = container["command"][-1]
        m = re.search(r"export METAFLOW_TASK_ID=(\S+)", script)
        assert m
        argv = _expand(_step_fragment(script), env, prelude="export METAFLOW_TASK_ID=%s; " % m.group(1))
        node_index = 0 if rjob == "control" else index + 1
        assert _option(argv, "--split-index") == str(node_index)
        assert _option(argv, "--ubf-context") == env["UBF_CONTEXT"]
        task_id = _option(argv, "--task-id")
        if rjob == "control":
            assert task_id == env["MF_PARALLEL_CONTROL_TASK_ID"]
        identity = runner.GangIdentity(
            flow_name="SubmitFlow", run_id=_option(argv, "--run-id"), step_name="train",
            control_task_id=env["MF_PARALLEL_CONTROL_TASK_ID"], attempt=int(_option(argv, "--retry-count")),
        )
        candidates = ports.choose_ports(env, identity.gang_id)
        views.append((identity.gang_id, candidates, task_id))

    # Every node agrees on the gang and on where the control listens.
    assert len({v[0] for v in views}) == 1 and len({v[1] for v in views}) == 1
    assert len({v[2] for v in views}) == nodes  # distinct task ids
    candidates = views[0][1]
    if port:
        assert candidates == (port,)
    else:
        assert len(candidates) == ports.CANDIDATE_PORTS
        assert all(ports.PORT_RANGE[0] <= p <= ports.PORT_RANGE[1] for p in candidates)


def test_argo_create_without_only_json_would_need_a_cluster(tmp_path, moto):
    """The isolation is real: without --only-json the same command looks for a
    kube config (to find the existing deployment's token) and fails."""
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "kubernetes", {"gpu": 2}, 2)
    proc = _run_flow(env, tmp, "argo-workflows", "create", timeout=90)
    assert proc.returncode != 0
    assert "kube-config" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_jobset_validation_is_not_vacuous(tmp_path, moto):
    """The checks above would catch a manifest the cluster refuses."""
    import copy

    _, manifest, _ = argo_jobset(tmp_path, moto, {"gpu": 2, "port": 29400}, 2)
    bad = copy.deepcopy(manifest)
    bad["spec"]["replicatedJobs"][1]["replicas"] = "1"  # what an unsubstituted quote would give
    with pytest.raises(AssertionError, match="replicas"):
        validate_jobset(bad)
    bad = copy.deepcopy(manifest)
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    with pytest.raises(AssertionError, match="portz"):
        validate_jobset(bad)
    bad = copy.deepcopy(manifest)
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = 7
    with pytest.raises(AssertionError, match="name"):
        validate_jobset(bad)


def test_kubernetes_jobset_of_run_with_kubernetes_is_valid():
    """The JobSet of ``run --with kubernetes`` (Kubernetes.create_jobset, built by
    contracts.py for the multi-host harness) passes the same validation."""
    from .contracts import kubernetes_manifest

    for port in (29400, None):
        manifest = kubernetes_manifest(3, "t-1", port, namespace=NAMESPACE)
        control_addr = manifest.pop("_control_addr")
        manifest = _prune_nulls(manifest)
        # contracts.py passes attempt=0 where kubernetes_cli.py passes
        # str(retry_count): the annotation is a string in what Metaflow submits.
        for rjob in manifest["spec"]["replicatedJobs"]:
            annotations = rjob["template"]["spec"]["template"]["metadata"]["annotations"]
            annotations["metaflow/attempt"] = str(annotations["metaflow/attempt"])
        validate_jobset(manifest)
        layout = [(r["name"], r["replicas"]) for r in manifest["spec"]["replicatedJobs"]]
        assert layout == [("control", 1), ("worker", 2)]
        name = manifest["metadata"]["name"]
        assert control_addr == "%s-control-0-0.%s.%s.svc.cluster.local" % (name, name, NAMESPACE)


# ------------------------------------------- Kubernetes: lost worker pods come back

SPARES = {"spares": 1, "restarts": 1}  # @torchrun: a spare needs an in-step restart to come in
DISRUPTED_POD_RULE = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def check_lost_workers_back(manifest: Dict) -> None:
    """The worker Job of a step with spares replaces a disrupted pod; the control Job is Metaflow's;
    the cluster would take both as written: the JobSet CRD's schema, and the Job API's own models
    (each Job spec read into the client's V1JobSpec and written back loses nothing)."""
    from kubernetes import client

    validate_jobset(manifest)
    api = client.ApiClient()
    policies = {}
    for rjob in manifest["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        model = api._ApiClient__deserialize(job, "V1JobSpec")
        assert api.sanitize_for_serialization(model) == job
        assert job["template"]["spec"]["restartPolicy"] == "Never"  # what the API requires of the policy
        policies[rjob["name"]] = job.get("podFailurePolicy")
    assert policies == {"control": None, "worker": {"rules": [DISRUPTED_POD_RULE]}}
    # The JobSet completes with its control Job, not with a worker pod that may never come back.
    assert manifest["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["control"]}


def test_kubernetes_jobset_from_argo_of_a_step_with_spares(tmp_path, moto):
    _, manifest, _ = argo_jobset(tmp_path, moto, {"gpu": 2}, 3, torchrun=SPARES)
    check_lost_workers_back(manifest)
    layout = [(r["name"], r["replicas"]) for r in manifest["spec"]["replicatedJobs"]]
    assert layout == [("control", 1), ("worker", 2)]


class FakeKubernetesApi:
    """An API server that records what is created and refuses it (HTTP 403): ``kubernetes step``
    submits its JobSet through the real client, then fails at once; nothing runs."""

    def __init__(self, directory: str):
        import http.server
        import threading

        self.created: List[Tuple[str, Dict]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                api.created.append((self.path, json.loads(body or b"{}")))
                self._answer(403, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "message": "refused by the test's API server", "code": 403})

            def do_GET(self):
                self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def _answer(self, code, doc):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.kubeconfig = os.path.join(directory, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                       "clusters": [{"name": "t", "cluster": {"server": "http://127.0.0.1:%d" % self.server.server_port}}],
                       "users": [{"name": "t", "user": {"token": "t"}}],
                       "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t", "namespace": NAMESPACE}}]},
                      f)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.mark.parametrize("torchrun", [SPARES, {}], ids=["spares", "none"])
def test_kubernetes_jobset_that_run_submits(torchrun, tmp_path, moto):
    """``python flow.py run`` with ``@kubernetes`` on ``train``: ``start`` runs here, then Metaflow's runtime
    starts ``kubernetes step train``, which builds the JobSet and POSTs it to the (fake) API server."""
    tmp = str(tmp_path)
    api = FakeKubernetesApi(tmp)
    try:
        env = _flow_env(moto, tmp, "kubernetes", {"gpu": 2}, 3, extra={
            "KUBECONFIG": api.kubeconfig, "MFTR_SUBMIT_TORCHRUN": json.dumps(torchrun)})
        proc = _run_flow(env, tmp, "run", timeout=120)
    finally:
        api.close()
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "refused by the test's API server" in output, output[-3000:]
    (path, manifest), = api.created
    assert path == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/%s/jobsets" % NAMESPACE
    manifest = _prune_nulls(manifest)
    if torchrun:
        check_lost_workers_back(manifest)
    else:
        validate_jobset(manifest)
        assert [r["template"]["spec"].get("podFailurePolicy") for r in manifest["spec"]["replicatedJobs"]] == [
            None, None]
        assert "successPolicy" not in manifest["spec"]
    assert manifest["spec"]["startupPolicy"] == {"startupPolicyOrder": "InOrder"}  # run's, not Argo's


# -------------------------------------------------------------------- AWS Batch


def batch_submission(tmp_path, moto, role: str, attrs: Dict, nodes: int,
                     resources: Optional[Dict] = None, flow: str = FLOW) -> Dict:
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "batch", attrs, nodes, resources, extra={
        "METAFLOW_BATCH_JOB_QUEUE": QUEUE,
        "METAFLOW_ECS_S3_ACCESS_IAM_ROLE": role,
    })
    moto.record(True)
    try:
        proc = _run_flow(env, tmp, "run", timeout=120, flow=flow)
    finally:
        moto.record(False)
    output = proc.stdout + proc.stderr
    # moto never runs the job: Metaflow finds no task data afterwards.
    assert proc.returncode != 0, output[-3000:]
    assert "No completed attempts of the task was found" in output, output[-3000:]
    calls = {}
    for entry in moto.recorded():
        op = entry["url"].rsplit("/", 1)[-1]
        if op in ("registerjobdefinition", "submitjob"):
            assert op not in calls, "more than one %s" % op
            calls[op] = json.loads(entry["body"])
    assert set(calls) == {"registerjobdefinition", "submitjob"}, output[-3000:]
    batch = moto.client("batch")
    job_id = re.search(r"\[([0-9a-f-]{36})\] Task is starting", output).group(1)
    return {
        "registered": calls["registerjobdefinition"],
        "submitted": calls["submitjob"],
        "definition": batch.describe_job_definitions(
            jobDefinitions=[calls["submitjob"]["jobDefinition"]])["jobDefinitions"],
        "job": batch.describe_jobs(jobs=[job_id])["jobs"],
        "output": output,
    }


def _nodes_of(submitted: Dict, nodes: int) -> List[Tuple[int, Dict]]:
    """(node index, container overrides) for every node of the job."""
    out = []
    for override in submitted["nodeOverrides"]["nodePropertyOverrides"]:
        first, last = (int(x) for x in override["targetNodes"].split(":"))
        out.extend((i, override["containerOverrides"]) for i in range(first, last + 1))
    assert sorted(i for i, _ in out) == list(range(nodes))
    return sorted(out, key=lambda x: x[0])


def _node_env(container: Dict, index: int, nodes: int) -> Dict[str, str]:
    env = {e["name"]: e["value"] for e in container["environment"]}
    # What the Batch service adds to every node's container.
    env.update({"AWS_BATCH_JOB_NUM_NODES": str(nodes), "AWS_BATCH_JOB_NODE_INDEX": str(index),
                "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"})
    if index:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "10.0.1.10"
    return env


BATCH_CASES = {
    # name: (@batch attributes, num_parallel, @resources attributes)
    "gpu2-3nodes": ({"gpu": 2}, 3, None),
    "batch-gpu2-over-resources-gpu1-shm": ({"gpu": 2, "shared_memory": 16384}, 2, {"gpu": 1}),
}


@pytest.mark.parametrize("case", list(BATCH_CASES))
def test_batch_multinode_job_through_moto(case, tmp_path, moto, batch_queue):
    attrs, nodes, resources = BATCH_CASES[case]
    got = batch_submission(tmp_path, moto, batch_queue, attrs, nodes, resources)
    resources_mod, runner, topology, ports = _extension()
    decorators = [("batch", attrs)] + ([("resources", resources)] if resources else [])
    accelerators = resources_mod.requested_accelerators(decorators)
    expected_gpus = max(attrs["gpu"], (resources or {}).get("gpu") or 0)  # @batch: the larger wins
    assert accelerators.nproc == expected_gpus

    # The job definition, as registered and as moto describes it back (moto's
    # DescribeJobDefinitions leaves nodeProperties out; its DescribeJobs gives the
    # stored definition's).
    (definition,) = got["definition"]
    (job,) = got["job"]
    registered = got["registered"]
    assert registered["type"] == definition["type"] == "multinode"
    assert definition["status"] == "ACTIVE"
    props = registered["nodeProperties"]
    assert job["nodeProperties"] == props
    assert props["numNodes"] == nodes and props["mainNode"] == 0
    ranges = [r["targetNodes"] for r in props["nodeRangeProperties"]]
    assert ranges == ["0:0", "1:%d" % (nodes - 1)]
    for r in props["nodeRangeProperties"]:
        linux = r["container"].get("linuxParameters") or {}
        if attrs.get("shared_memory"):
            assert linux["sharedMemorySize"] == attrs["shared_memory"]
        else:
            assert "sharedMemorySize" not in linux  # Docker's 64 MiB /dev/shm
        # GPUs are not in the definition: they come with each node's override.
        assert "GPU" not in {q["type"] for q in r["container"]["resourceRequirements"]}

    # The job, as moto describes it (moto keeps no nodeOverrides).
    assert job["jobDefinition"] == definition["jobDefinitionArn"]
    assert job["jobQueue"].endswith("/" + QUEUE)
    assert job["nodeProperties"]["numNodes"] == nodes
    assert job["parameters"]["metaflow.step_name"] == "train"

    # The submit request: one override for the main node, one for the others.
    submitted = got["submitted"]
    assert "containerOverrides" not in submitted
    assert [o["targetNodes"] for o in submitted["nodeOverrides"]["nodePropertyOverrides"]] == [
        "0:0", "1:%d" % (nodes - 1)]
    control_task_id = submitted["parameters"]["metaflow.task_id"]
    views = []
    for index, container in _nodes_of(submitted, nodes):
        env = _node_env(container, index, nodes)
        assert env["METAFLOW_RUNTIME_ENVIRONMENT"] == "aws-batch"
        assert not topology.is_local_runtime(env)
        # @torchrun takes the gang's id from it (a child's own task id is "<id>-node-<i>").
        assert env["MF_PARALLEL_CONTROL_TASK_ID"] == control_task_id
        assert "MF_MASTER_PORT" not in env  # Batch has no port to give
        gpus = [q["value"] for q in container["resourceRequirements"] if q["type"] == "GPU"]
        assert gpus == [str(expected_gpus)]
        argv = _expand(_step_fragment(container["command"][-1]), env)
        assert _option(argv, "--split-index") == str(index)
        if index == 0:
            assert _option(argv, "--ubf-context") == "ubf_control"
            assert _option(argv, "--task-id") == control_task_id
            run_id = _option(argv, "--run-id")
        else:
            assert _option(argv, "--ubf-context") == "ubf_task"
            assert _option(argv, "--task-id") == "%s-node-%d" % (control_task_id, index)
        identity = runner.GangIdentity(
            flow_name="SubmitFlow", run_id=run_id, step_name="train",
            control_task_id=env["MF_PARALLEL_CONTROL_TASK_ID"], attempt=int(_option(argv, "--retry-count")),
        )
        views.append(ports.choose_ports(env, identity.gang_id))
    assert len(set(views)) == 1 and len(views[0]) == ports.CANDIDATE_PORTS


@pytest.mark.xfail(strict=True, reason=(
    "Metaflow 2.19.39 BatchJob.execute() builds the child nodes' command with "
    "str.replace(task_id, task_id + '-node-$AWS_BATCH_JOB_NODE_INDEX') over the whole "
    "bash script: with a short task id (local metadata: '2') it also rewrites '2>>', "
    "'>&2', ${T:0:26}, the code package's key and any '2' in the run id, so the "
    "child nodes' command is not valid bash"))
def test_batch_child_nodes_command_is_intact(tmp_path, moto, batch_queue):
    got = batch_submission(tmp_path, moto, batch_queue, {"gpu": 2}, 2)
    nodes = _nodes_of(got["submitted"], 2)
    main_script = nodes[0][1]["command"][-1]
    for index, container in nodes:
        script = container["command"][-1]
        check = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        assert check.returncode == 0, "node %d: %s" % (index, check.stderr)
        env = _node_env(container, index, 2)
        assert env["METAFLOW_CODE_URL"].split("/")[-1] in script  # the code package it downloads
        argv = _expand(_step_fragment(script), env)
        main_argv = _expand(_step_fragment(main_script), _node_env(nodes[0][1], 0, 2))
        assert _option(argv, "--run-id") == _option(main_argv, "--run-id")
