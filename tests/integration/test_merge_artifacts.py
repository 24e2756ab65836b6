"""Metaflow's own join idiom, ``self.merge_artifacts(inputs)``, after two
@torchrun steps (issue 52; tests/flows/two_steps_flow.py): the artifacts
@torchrun keeps are the step's own, on the one node that holds them, so no join
sees two values of one name. A worker of the second step used to carry the first
step's ``torchrun_goodput`` (passed down by the first join) while its control set
its own, and the second join failed. Both cases: every attempt succeeds, and each
step's first attempt fails on node 1 and @retry runs it again."""

import pytest

from .helpers import output

pytestmark = pytest.mark.integration

# Every artifact @torchrun keeps (record/step_record.ARTIFACTS).
NAMES = ("torchrun_report", "torchrun_goodput", "torchrun_evidence")

_INSPECT = r"""
from metaflow_extensions.torchrun.plugins.torchrun.record import evidence
NAMES = %r

def kept(t):
    return sorted(n for n in NAMES if n in t)

run = Flow('TwoStepsFlow').latest_run
result = {'successful': run.successful, 'steps': {}}
for name, join in (('preprocess', 'end_preprocess'), ('train', 'end_train')):
    j = run[join].task
    result['steps'][name] = {
        'join': kept(j),
        'join_goodput': j['torchrun_goodput'].data if 'torchrun_goodput' in j else None,
        'tasks': [{'control': '_node_' not in t.id, 'attempt': t.current_attempt, 'kept': kept(t),
                   'goodput': t['torchrun_goodput'].data if 'torchrun_goodput' in t else None,
                   'first': evidence.read(t.pathspec, attempt=0) if t.current_attempt else None}
                  for t in run[name]]}
""" % (NAMES,)


def _run(gang, case):
    proc = gang.run(flow="two_steps_flow.py", env={"MFTR_TWO": case}, timeout=400)
    text = output(proc)
    assert proc.returncode == 0 and "cannot merge" not in text, text[-4000:]
    seen = gang.client(_INSPECT)
    assert seen["successful"], seen
    steps = seen["steps"]
    for name, step in steps.items():
        control = [t for t in step["tasks"] if t["control"]]
        workers = [t for t in step["tasks"] if not t["control"]]
        assert len(control) == 1 and len(workers) == 1, step
        control = control[0]
        # The step's own ledger, on its control; nothing of another step anywhere.
        assert control["goodput"] is not None and "torchrun_goodput" in control["kept"], (name, control)
        assert workers[0]["kept"] == [], (name, workers[0])
        # The join merged the control's artifacts, unchanged.
        assert step["join"] == control["kept"] and step["join_goodput"] == control["goodput"], (name, step)
    assert steps["train"]["join_goodput"] != steps["preprocess"]["join_goodput"]
    return steps


def test_merge_artifacts_joins_two_torchrun_steps(gang):
    steps = _run(gang, "ok")
    for step in steps.values():
        assert all(t["attempt"] == 0 for t in step["tasks"]), step
        assert [s["attempt"] for s in step["join_goodput"]["segments"]] == [0], step


def test_merge_artifacts_joins_two_torchrun_steps_after_a_retried_failure(gang):
    steps = _run(gang, "retry")
    for name, step in steps.items():
        assert all(t["attempt"] == 1 for t in step["tasks"]), (name, step)
        # The merged ledger is this step's, with both its attempts.
        assert [s["attempt"] for s in step["join_goodput"]["segments"]] == [0, 1], (name, step)
        # The failed attempt kept its evidence: the control's, and node 1's own.
        control = [t for t in step["tasks"] if t["control"]][0]
        worker = [t for t in step["tasks"] if not t["control"]][0]
        assert control["first"]["cause"]["node_index"] == 1 and control["first"]["attempt"] == 0, (name, control)
        assert worker["first"]["node"] == 1 and "nvidia_smi" in worker["first"], (name, worker)
