"""``python flow.py torchrun history`` on an S3 datastore (moto's server,
test_submitted.py's fixture) with the local metadata: a real local run of
tests/flows/gang_flow.py whose node 1 (host "bad-host") is SIGKILLed, its
artifacts and the gang's secret on S3, then the command with the same
options reads who failed."""

from __future__ import annotations

import json
import os

from .test_submitted import _flow_env, _run_flow, moto  # noqa: F401  (moto: the module's server fixture)

FLOWS = os.path.join(os.path.dirname(__file__), "..", "flows")


def test_the_history_command_reads_a_run_on_s3(tmp_path, moto):  # noqa: F811
    tmp = str(tmp_path)
    env = _flow_env(moto, tmp, "local", {}, 2, extra={
        "METAFLOW_TORCHRUN_TEST_HOSTS": "good-host,bad-host", "MFTR_TEST_OUT": os.path.join(tmp, "out")})
    flow = os.path.join(FLOWS, "gang_flow.py")
    run = _run_flow(env, tmp, "--datastore", "s3", "run", "--script", "node_dies.py", "--script-args",
                    '["--rank", "1"]', "--nproc", "1", flow=flow, timeout=300)
    assert run.returncode != 0 and "killed by signal SIGKILL" in run.stdout + run.stderr, run.stderr[-3000:]
    proc = _run_flow(env, tmp, "--datastore", "s3", "torchrun", "history", "--last", "5", "--json", flow=flow)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert report["runs"] == 1 and report["hosts"][0]["host"] == "bad-host", report
    assert report["hosts"][0]["roles"] == {"culprit": 1}, report
