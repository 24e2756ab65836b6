"""What users of Metaflow's @parallel rely on, on a @torchrun step (issue 25,
items 0 and 7): Metaflow's CatchRetryTest, MultipleCardDecoratorTest and
DefaultEditableCardTest, rewritten as real flows of our own (the harness lives in
Metaflow's repository, not in its package).

- Cards: a user's cards (and @model's, @gpu_profile's, which use current.card)
  work on every node, each holding that node's content.
- @retry: every node's task of the final attempt carries that attempt's number,
  artifacts, cards and logs; each earlier attempt's log holds its own lines.
- @catch: the step goes on; each node's task holds an exception. By design the
  gang stops every node when one fails: a node stopped by another's failure
  holds GangAborted naming the first failure, not an exception of its own.
"""


import pytest

from .helpers import output

pytestmark = pytest.mark.integration

_INSPECT = r"""
import base64, re
from metaflow import Task
from metaflow.cards import get_cards

def card_lines(task):
    out = {}
    for c in get_cards(task):
        m = re.search(r'__MF_DATA__\["[^"]+"\] = "([^"]+)"', c.get())
        text = base64.b64decode(m.group(1)).decode() if m else ""
        out[str(c.id)] = re.findall(r"(?:default|extra) card: node \d attempt \d", text)
    return out

run = Flow('ParallelFlow').latest_run
result = {'successful': run.successful, 'tasks': {}}
for t in run['train']:
    ex = t['ex'].data if 'ex' in t else None
    result['tasks'][str(t['node'].data if 'node' in t else t.id)] = {
        'id': t.id,
        'current_attempt': t.current_attempt,
        'attempt': t['attempt'].data if 'attempt' in t else None,
        'ex': None if ex is None else [str(ex.type), str(ex.exception)],
        'cards': card_lines(t),
        'logs': [re.findall(r"std\w+: node \d attempt \d", Task(t.pathspec, attempt=a).stdout + Task(t.pathspec, attempt=a).stderr)
                 for a in range(t.current_attempt + 1)],
    }
"""


def _run(gang, case):
    proc = gang.run(flow="parallel_flow.py", env={"MFTR_PAR": case}, timeout=300)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "card WARNING" not in text and "is not present" not in text, text[-4000:]
    return gang.client(_INSPECT)


def test_retry_every_node_carries_the_final_attempt_with_its_cards_and_logs(gang):
    seen = _run(gang, "retry")
    assert seen["successful"]
    tasks = seen["tasks"]
    assert sorted(tasks) == ["0", "1"]
    for node in (0, 1):
        task = tasks[str(node)]
        assert task["current_attempt"] == 2 and task["attempt"] == 2, task
        assert task["ex"] is None, task  # the attempt that succeeded caught nothing
        # The user's two cards on every node, each with that node's content (item 0).
        assert task["cards"]["None"] == ["default card: node %d attempt 2" % node], task
        assert task["cards"]["extra"] == ["extra card: node %d attempt 2" % node], task
    # @torchrun's own card: on the control only.
    assert "torchrun" in tasks["0"]["cards"] and "torchrun" not in tasks["1"]["cards"]
    # Logs per attempt: locally Metaflow keeps every node's output in the control
    # task's log (as with @parallel); each attempt's log holds that attempt's lines.
    for attempt, lines in enumerate(tasks["0"]["logs"]):
        assert "stdout: node 0 attempt %d" % attempt in lines and "stderr: node 0 attempt %d" % attempt in lines
        assert all(line.endswith("attempt %d" % attempt) for line in lines), lines


def test_catch_each_node_holds_an_exception_and_the_run_goes_on(gang):
    seen = _run(gang, "catch")
    assert seen["successful"]
    tasks = {t["id"]: t for t in seen["tasks"].values()}
    control = [t for i, t in tasks.items() if "_node_" not in i][0]
    worker = [t for i, t in tasks.items() if "_node_" in i][0]
    for task in (control, worker):
        assert task["current_attempt"] == 1, task  # @retry(times=1) ran out, then @catch
        assert task["ex"] is not None, task
    # Node 0 raised its own exception; its artifacts set before it are kept.
    assert control["ex"][0].endswith("TestRetry") and "node 0 attempt 1" in control["ex"][1], control
    assert control["attempt"] == 1
    # The worker either raised its own first or was stopped by the gang, which
    # names the first failure.
    kind, text = worker["ex"]
    assert kind.endswith("TestRetry") or (kind.endswith("GangAborted") and "failed first" in text), worker
    # Every node's card is there, the user's content in it where its code ran.
    assert control["cards"]["None"] == ["default card: node 0 attempt 1"], control
    assert "None" in worker["cards"] and "extra" in worker["cards"], worker
