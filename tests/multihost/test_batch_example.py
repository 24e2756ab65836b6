"""The shipped examples/batch flow, submitted as it is to moto's AWS Batch
(test_submitted.py's method: Metaflow's own ``batch step`` registers the
multi-node job definition and submits the job; the requests are read from
moto's recorder): the job has the example's nodes, queue, GPUs, EFA devices
and shared memory."""

from __future__ import annotations

import os

import pytest

from .test_submitted import (  # noqa: F401  (moto, batch_queue: the module's fixtures)
    REPO,
    _nodes_of,
    batch_queue,
    batch_submission,
    moto,
)

FLOW = os.path.join(REPO, "examples", "batch", "flow.py")


@pytest.fixture(scope="module")
def example_queue(moto, batch_queue):  # noqa: F811
    """The queue the example names, on the harness's compute environment."""
    batch = moto.client("batch")
    (env,) = batch.describe_compute_environments(computeEnvironments=["mftr-ce"])["computeEnvironments"]
    batch.create_job_queue(jobQueueName="mnp-on-demand", state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env["computeEnvironmentArn"]}])
    return batch_queue


def test_the_batch_example_is_submitted_as_one_multinode_job(tmp_path, moto, example_queue):  # noqa: F811
    got = batch_submission(tmp_path, moto, example_queue, {}, 4, flow=FLOW)
    (job,) = got["job"]
    assert job["jobQueue"].endswith("/mnp-on-demand")
    props = got["registered"]["nodeProperties"]
    assert got["registered"]["type"] == "multinode" and props["numNodes"] == 4 and props["mainNode"] == 0
    for r in props["nodeRangeProperties"]:
        linux = r["container"]["linuxParameters"]
        assert linux["sharedMemorySize"] == 16384
        assert sorted(d["hostPath"] for d in linux["devices"]) == ["/dev/infiniband/uverbs%d" % i for i in range(4)]
    for _index, container in _nodes_of(got["submitted"], 4):
        gpus = [q["value"] for q in container["resourceRequirements"] if q["type"] == "GPU"]
        assert gpus == ["8"]  # @torchrun's nproc_per_node on every node
        env = {e["name"]: e["value"] for e in container["environment"]}
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"  # the example's @environment
