"""Our lines never split a rank's (issue 36, item 2): a rank prints a 200-line
tensor eight times while the control says a line every 10 ms; on the console
every tensor's lines are together, and every line of ours is whole.
``MFTR_REPEAT=20`` runs it 20 times in a row (done by hand; CI runs it once)."""

import os
import re

import pytest

from .helpers import output, without_task_prefix

pytestmark = pytest.mark.integration

REPEAT = int(os.environ.get("MFTR_REPEAT", "1"))


@pytest.mark.parametrize("attempt", range(REPEAT))
def test_a_line_of_ours_never_lands_inside_a_ranks_multi_line_print(gang, attempt):
    proc = gang.run(flow="talk_flow.py", timeout=240)
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    lines = without_task_prefix(text).splitlines()
    ours = [line for line in lines if "@torchrun:" in line]
    assert any("the control speaks" in line for line in ours), text[-3000:]  # it did speak meanwhile
    assert all(line.startswith("@torchrun: ") for line in ours), [l for l in ours if not l.startswith("@torchrun")]
    for i in range(8):
        begin = lines.index("[rank0]: tensor %d begins" % i)
        end = lines.index("[rank0]: tensor %d ends" % i)
        block = lines[begin:end + 1]
        assert len(block) == 202, "tensor %d is split:\n%s" % (i, "\n".join(l for l in block if "[rank0]" not in l))
        assert all(re.match(r"\[rank0\]: ", line) for line in block)
