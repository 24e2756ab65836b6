"""Our lines never split a rank's (issue 36, item 2): a rank prints a 200-line
tensor eight times while the control says a line every 10 ms; on the console
every tensor's lines are together, and every line of ours is whole.
``MFTR_REPEAT=20`` runs it 20 times in a row (done by hand; CI runs it once).
And the console shows text as written (issue 83), read from the shared calls run."""

import os
import re

import pytest

from .calls import STEP_PRINTS
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


STARS = "step must be an int from 0 to 2**53; lambda s: 0.9 ** s; f(*args, **kwargs)"  # console_text.py's


def test_a_ranks_line_reaches_the_console_as_written_with_one_label(calls_run):
    """Issue 83: a rank's stars kept; torch's C++ warning, which torch labels ``[rank1]:`` itself once the
    process group is up, with that one label, not ``[rank1]: [rank1]:[W...``."""
    lines = without_task_prefix(calls_run.text).splitlines()
    for r in range(4):
        assert "[rank%d]: rank %d says: %s" % (r, r, STARS) in lines, calls_run.text[-3000:]
    assert "[rank1]: rank 1's store wait ended: DistStoreError" in lines
    torchs = [line for line in lines if line.startswith("[rank1]:[W")]
    assert any("socket.cpp" in line or "TCPStore" in line for line in torchs), [l for l in lines if "[W" in l]
    doubled = [line for line in lines if re.match(r"\[rank\d+\]: ?\[rank\d+\]:", line)]
    assert not doubled, doubled


def test_two_nodes_printing_in_their_step_at_once_keep_a_line_each(calls_run):
    """Issue 83: the step's print() on both local nodes at once (they share the console's pipe): each
    line whole, none two nodes' (print() wrote its text and its newline apart)."""
    assert calls_run.reports("console_text", "print-writes-") == {0: 1, 1: 1}  # one write(2) per print()
    lines = without_task_prefix(calls_run.text).splitlines()
    for node in range(2):
        printed = [line for line in lines if line.startswith("node %d prints line " % node)]
        expected = ["node %d prints line %d of its step" % (node, i) for i in range(STEP_PRINTS)]
        assert printed == expected, [line for line in printed if line not in expected][:5]
    merged = [line for line in lines if line.count("prints line") > 1]
    assert not merged, merged[:5]
