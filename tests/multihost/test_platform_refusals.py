"""Settings that only fail on a platform are refused before anything is
submitted (issue 35, item 4), through Metaflow's own deployment commands with
no cluster: ``argo-workflows create --only-json`` and ``step-functions create
--only-json`` of tests/flows/submit_flow.py, the datastore on moto's S3
(test_submitted.py's fixtures).

Each refusal's message is checked in this process (tests/step_init.py: the
flow's start as the command's own ``sys.argv`` has it, up to @torchrun's
``step_init``); one real command per deployment command is the witness that
the refusal reaches the console, exits non-zero and compiles nothing."""

from __future__ import annotations

import json
import os

import pytest
import step_init

from .test_submitted import REPO, _flow_env, _run_flow, moto  # noqa: F401  (moto: the module's server fixture)

ARGO = ("--no-pylint", "argo-workflows", "create", "--only-json")
PORT_CLASHES = {
    "rdzv_port": ({"rdzv_port": 29400}, "@torchrun(rdzv_port)=29400"),
    "0.2-master_port": ({"torchrun_args": {"master_port": 29400}}, "master_port=29400"),  # metaflow-torchrun 0.2's
}


def _submit_env(platform: str, attrs, nodes: int, torchrun_attrs=None):
    """submit_flow.py's settings (test_submitted._flow_env's, less moto's)."""
    return {"MFTR_SUBMIT_PLATFORM": platform, "MFTR_SUBMIT_ATTRS": json.dumps(attrs), "MFTR_SUBMIT_NODES": str(nodes),
            "MFTR_SUBMIT_RESOURCES": "null", "MFTR_SUBMIT_TORCHRUN": json.dumps(torchrun_attrs or {})}


@pytest.mark.parametrize("case", sorted(PORT_CLASHES))
def test_a_port_clash_with_kubernetes_port_is_refused_at_start(case):
    torchrun_attrs, named = PORT_CLASHES[case]
    text = step_init.refusal("submit_flow.py", _submit_env("kubernetes", {"port": 29400}, 2, torchrun_attrs), ARGO).text
    assert "@kubernetes(port=29400) and %s" % named in text, text
    assert "pin it to another port" in text  # the fix


def test_a_port_clash_with_kubernetes_port_is_refused_at_compile_time(tmp_path, moto):  # noqa: F811
    """The real `argo-workflows create`: the witness for every refusal above."""
    tmp = str(tmp_path)
    torchrun_attrs, named = PORT_CLASHES["rdzv_port"]
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
    """A real `step-functions create`: the refusal reads the command's own argv."""
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "batch", {}, 2)
    proc = _run_flow(env, tmp, "step-functions", "create", "--only-json", timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "@torchrun steps cannot be deployed to AWS Step Functions" in out, out[-3000:]
    assert "argo-workflows create" in out and "--with batch" in out


def test_one_node_on_kubernetes_is_refused_at_compile_time(tmp_path):
    """Metaflow itself refuses num_parallel=1 on Kubernetes only when it launches
    the pod; @torchrun refuses a literal 1 when the flow is compiled."""
    example = os.path.join(REPO, "examples", "kubernetes")
    with open(os.path.join(example, "flow.py")) as f:
        text = f.read()
    assert "num_parallel=2)" in text
    flow = tmp_path / "flow.py"
    flow.write_text(text.replace("num_parallel=2)", "num_parallel=1)"))
    out = step_init.refusal(str(flow), _submit_env("kubernetes", {}, 1), ARGO).text
    assert "num_parallel=1 on a @kubernetes step" in out, out
    assert "TorchrunSingleNodeMultiGPU" in out
