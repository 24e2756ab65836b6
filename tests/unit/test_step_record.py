"""record/step_record.drop_inherited against Metaflow's own local datastore:
a task of a @torchrun step passes on none of @torchrun's artifacts it inherited
(issue 52: a second @torchrun step's join failed in merge_artifacts), and
every other inherited artifact as before. The flow run of the same is
tests/integration/test_merge_artifacts.py; this pins the Metaflow internals
the drop relies on (the input datastore's table, which ``persist`` copies)."""

import os
import re

from metaflow import FlowSpec, step
from metaflow.datastore import FlowDataStore
from metaflow.plugins.datastores.local_storage import LocalStorage

from metaflow_extensions.torchrun.plugins.torchrun.record import step_record


class OneStep(FlowSpec):
    @step
    def start(self):
        pass


def _passed_on(tmp_path, drop):
    """What a task whose input holds every @torchrun artifact keeps, after
    its code read one of them (Metaflow caches what the code reads)."""
    store = FlowDataStore("OneStep", storage_impl=LocalStorage, ds_root=str(tmp_path))
    parent = store.get_task_datastore("1", "join", "3", attempt=0, mode="w")
    parent.init_task()
    parent.save_artifacts(iter([(name, {"of": "preprocess"}) for name in step_record.ARTIFACTS] + [("rows", 7)]))
    parent.done()
    flow = OneStep.__new__(OneStep)  # the task's flow object, as Metaflow's task sees it
    flow._datastore = store.get_task_datastore("1", "join", "3", mode="r")
    assert flow.torchrun_goodput == {"of": "preprocess"}  # the step's code may still read it
    if drop:
        step_record.drop_inherited(flow)
    out = store.get_task_datastore("1", "train", "4", attempt=0, mode="w")
    out.init_task()
    out.persist(flow)
    out.done()
    return {name for name, _ in store.get_task_datastore("1", "train", "4", mode="r").items()}


def test_inherited_torchrun_artifacts_are_not_passed_on(tmp_path):
    kept = _passed_on(tmp_path, drop=True)
    assert "rows" in kept
    assert not kept & set(step_record.ARTIFACTS), kept


def test_without_the_drop_metaflow_passes_them_on(tmp_path):
    # The premise: Metaflow itself keeps every inherited artifact.
    assert set(step_record.ARTIFACTS) <= _passed_on(tmp_path, drop=False)


def test_every_artifact_name_of_the_package_is_dropped():
    # A new artifact (a constant named *ARTIFACT*) must join the list, or a
    # later step would carry it again.
    package = os.path.dirname(step_record.__file__).rsplit(os.sep, 1)[0]
    named = set()
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    named |= set(re.findall(r'^\w*ARTIFACT\w* = "(\w+)"', f.read(), re.M))
    assert named == set(step_record.ARTIFACTS), named


def test_the_controls_record_is_built_from_the_attempts_facts_alone():
    """No session, no process, no socket: the record of an attempt that ran
    no call (its gang stopped first) names every node with its host and role
    (node 1 lost, with the preflight's failed check; node 2 taken out for a spare),
    keeps the card's hash, and cuts the attempt into the goodput ledger."""
    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
    from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import PreflightCheck
    from metaflow_extensions.torchrun.plugins.torchrun.gang.node_compare import Finding, PreflightRecord
    from metaflow_extensions.torchrun.plugins.torchrun.record.step_record import (AttemptFacts, ThisAttempt,
                                                                                  step_result)

    cause = Cause(CauseKind.NODE_LOST, "node 1 lost", node_index=1)
    check = PreflightCheck("gpu_count", "fail", found="7", expected="8")
    facts = AttemptFacts(is_control=True, node_index=0, num_nodes=3, cause=cause,
                         preflight=PreflightRecord("basic", nodes=3, reported=3, findings=(Finding(check, 1, (1,)),)),
                         hosts={0: "h0", 1: "h1", 2: "h2"}, taken_out=(2,), card="c" * 32)
    attempt = ThisAttempt(0)
    result = step_result(facts, attempt)
    assert result is not None and result.call == -1 and result.cause == cause
    (entry,) = result.attempts
    nodes = {n.node: n for n in entry.nodes}
    assert [nodes[i].host for i in range(3)] == ["h0", "h1", "h2"], entry.nodes
    assert nodes[1].checks == "gpu_count" and nodes[1].role == "lost" and nodes[2].role == "out", entry.nodes
    assert entry.card == "c" * 32 and result.preflight == facts.preflight
    assert result.goodput is not None and result.goodput.to_wire()
    assert step_result(None, attempt) is None


def test_one_builder_makes_the_attempts_preflight_and_a_refused_gangs_call_from_the_facts():
    """What runtime/preflight.py built apart before (the preflight's record with
    its job; the record of a gang the preflight refused) is step_result's: the
    gang service's findings get the job, and a refused gang reads as its call 0,
    refused before any rank, with the node's processes and address."""
    import json

    from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
    from metaflow_extensions.torchrun.plugins.torchrun.gang.node_compare import JobRecord, PreflightRecord
    from metaflow_extensions.torchrun.plugins.torchrun.record.step_record import (AttemptFacts, ThisAttempt,
                                                                                  step_result)

    cause = Cause(CauseKind.PREFLIGHT, "preflight refused the gang", node_index=1)
    job = JobRecord(backend="gloo", allreduce_ok=True, link_gbps={1: 2.5})
    found = PreflightRecord("full", nodes=2, reported=2)
    facts = AttemptFacts(is_control=True, node_index=0, num_nodes=2, cause=cause, preflight=found, job=job,
                         hosts={0: "h0", 1: "h1"}, nproc=4, main_addr="10.0.0.1")
    result = step_result(facts, ThisAttempt(0, started=1.0))
    assert result is not None and result.preflight == PreflightRecord("full", nodes=2, reported=2, job=job)
    assert (result.call, result.nproc_per_node, result.main_addr, result.cause) == (0, 4, "10.0.0.1", cause)
    stored = json.loads(result.to_json())
    assert stored["preflight"]["job"]["backend"] == "gloo" and stored["call"] == 0
    (entry,) = result.attempts
    assert [(n.node, n.role, n.link_gbps) for n in entry.nodes] == [(0, "bystander", None), (1, "culprit", 2.5)]
    # a gang stopped for another reason: a stand-in with no call, no address, no process count
    other = step_result(AttemptFacts(True, 0, 2, cause=Cause(CauseKind.NODE_LOST, "lost"), nproc=4,
                                     main_addr="10.0.0.1"), ThisAttempt(0, started=1.0))
    assert other is not None and (other.call, other.nproc_per_node, other.main_addr, other.started_at) == (-1, "", "", 1.0)
    # a worker keeps only its calls' records: none here
    assert step_result(AttemptFacts(False, 1, 2, cause=cause, nproc=4), ThisAttempt(0)) is None
