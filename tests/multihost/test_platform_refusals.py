"""Settings that only fail on a platform are refused before anything is
submitted (issue 35, item 4), through Metaflow's own deployment commands with
no cluster: ``argo-workflows create --only-json`` and ``step-functions create
--only-json`` of tests/flows/submit_flow.py, the datastore on moto's S3
(test_submitted.py's fixtures)."""

from __future__ import annotations

import json

import pytest

from .test_submitted import _flow_env, _run_flow, moto  # noqa: F401  (moto: the module's server fixture)


@pytest.mark.parametrize("torchrun_attrs, named", [
    ({"rdzv_port": 29400}, "@torchrun(rdzv_port)=29400"),
    ({"torchrun_args": {"master_port": 29400}}, "master_port=29400"),  # metaflow-torchrun 0.2's spelling
], ids=["rdzv_port", "0.2-master_port"])
def test_a_port_clash_with_kubernetes_port_is_refused_at_compile_time(tmp_path, moto, torchrun_attrs,  # noqa: F811
                                                                      named):
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "kubernetes", {"port": 29400}, 2,
                    extra={"MFTR_SUBMIT_TORCHRUN": json.dumps(torchrun_attrs)})
    proc = _run_flow(env, tmp, "argo-workflows", "create", "--only-json", timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "@kubernetes(port=29400) and %s" % named in out, out[-3000:]
    assert "pin it to another port" in out  # the fix
    assert "WorkflowTemplate" not in proc.stdout  # nothing compiled


def test_distinct_ports_still_compile(tmp_path, moto):  # noqa: F811
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "kubernetes", {"port": 29400}, 2,
                    extra={"MFTR_SUBMIT_TORCHRUN": json.dumps({"rdzv_port": 29401})})
    proc = _run_flow(env, tmp, "argo-workflows", "create", "--only-json", timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["kind"] == "WorkflowTemplate"


def test_step_functions_is_refused_at_once_naming_what_works(tmp_path, moto):  # noqa: F811
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "batch", {}, 2)
    proc = _run_flow(env, tmp, "step-functions", "create", "--only-json", timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "@torchrun steps cannot be deployed to AWS Step Functions" in out, out[-3000:]
    assert "argo-workflows create" in out and "--with batch" in out


def test_one_node_on_kubernetes_is_refused_at_compile_time(tmp_path, moto):  # noqa: F811
    """Metaflow itself refuses num_parallel=1 on Kubernetes only when it launches
    the pod; @torchrun refuses a literal 1 when the flow is compiled."""
    import os
    import shutil

    from .test_submitted import REPO

    example = os.path.join(REPO, "examples", "kubernetes")
    with open(os.path.join(example, "flow.py")) as f:
        text = f.read()
    assert "num_parallel=2)" in text
    flow = tmp_path / "flow.py"
    flow.write_text(text.replace("num_parallel=2)", "num_parallel=1)"))
    shutil.copy(os.path.join(example, "train.py"), tmp_path / "train.py")
    env = _flow_env(moto, str(tmp_path), "kubernetes", {}, 1)
    proc = _run_flow(env, str(tmp_path), "argo-workflows", "create", "--only-json", timeout=90, flow=str(flow))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "num_parallel=1 on a @kubernetes step" in out, out[-3000:]
    assert "TorchrunSingleNodeMultiGPU" in out
