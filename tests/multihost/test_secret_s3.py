"""The gang's secret travels through an S3 datastore, as on Kubernetes and AWS
Batch (gang/secret.py): a control process publishes it with Metaflow's own
S3 storage (``FlowDataStore`` with ``S3Storage``), a worker process, which
starts first and waits, fetches it; once withdrawn, a late worker is told at
once. S3 is moto's server (test_submitted.py's fixture); each side is its own
process with the environment a node has, since Metaflow reads its S3 settings
when it is imported."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from .test_submitted import _flow_env, moto  # noqa: F401  (moto: the module's server fixture)

NODE = r"""
import json, sys, time
from metaflow.datastore import FlowDataStore
from metaflow.plugins.datastores.s3_storage import S3Storage
from metaflow_extensions.torchrun.plugins.torchrun.gang import secret
from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity

role, out = sys.argv[1], {}
root = S3Storage.get_datastore_root_from_config(lambda *args, **kwargs: None)  # as a task finds it
storage = FlowDataStore("SubmitFlow", storage_impl=S3Storage, ds_root=root)._storage_impl
identity = GangIdentity(flow_name="SubmitFlow", run_id="r1", step_name="train", control_task_id="t-1", attempt=0)
if role == "control":
    value, published = secret.control_secret(storage, identity, None)
    out["secret"] = value.hex()
    out["uri"] = storage.full_uri(secret.secret_path(identity))
    time.sleep(float(sys.argv[2]))
    published.withdraw()
else:
    try:
        out["secret"] = secret.for_worker(storage, identity, None, timeout=float(sys.argv[2])).hex()
    except secret.SecretUnavailable as e:
        out["error"] = str(e)
print("@@" + json.dumps(out))
"""


def _node(env, role, seconds):
    return subprocess.Popen([sys.executable, "-c", NODE, role, str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads([line for line in out.splitlines() if line.startswith("@@")][-1][2:])


def test_the_secret_travels_through_an_s3_datastore(tmp_path, moto):  # noqa: F811
    env = _flow_env(moto, str(tmp_path), "kubernetes", {}, 2)
    worker = _node(env, "worker", 60)  # starts first, as a worker pod often does
    time.sleep(1)
    control = _node(env, "control", 3)
    got, published = _result(worker), _result(control)
    assert got["secret"] == published["secret"] and len(bytes.fromhex(got["secret"])) == 32
    assert published["uri"].startswith("s3://mftr-submitted/")
    assert published["uri"].endswith("/SubmitFlow/r1/train/t-1/torchrun-gang-secret.0")
    # Withdrawn once the control's step ended: a late worker is told at once, not after its timeout.
    began = time.monotonic()
    late = _result(_node(env, "worker", 60))
    assert "already ended" in late["error"] and time.monotonic() - began < 30
