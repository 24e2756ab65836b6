"""The console prints text as it is (issue 83): a rank's line keeps its one label
where torch labelled it already; a print() of the step or a line of ours is one
write, so a node sharing the pipe cannot land inside it; and Metaflow's CLI,
which highlights what stands between two ``*`` and drops them, prints our
errors and tracebacks with their asterisks."""

from __future__ import annotations

import os
import socket
import subprocess

from proc_helpers import PY

from metaflow_extensions.torchrun.plugins.torchrun.procs.relay import prefix_lines

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARS = "step must be an int from 0 to 2**53; lambda s: 0.9 ** s; f(*args, **kwargs)"


def test_a_line_torch_labelled_already_keeps_its_one_label():
    # torch's C++ log lines after its process group starts, and its excepthook's lines.
    data = (b"[rank0]:[W1128 10:00:00.000 socket.cpp:469] [c10d] waitForInput: timed out\n"
            b"plain\n"
            b"[rank0]: Traceback (most recent call last):\n"
            b"[rank0]:[W1128 10:00:01.000 reducer.cpp:1] again\n")
    assert prefix_lines(data, b"[rank0]: ") == (
        b"[rank0]:[W1128 10:00:00.000 socket.cpp:469] [c10d] waitForInput: timed out\n"
        b"[rank0]: plain\n"
        b"[rank0]: Traceback (most recent call last):\n"
        b"[rank0]:[W1128 10:00:01.000 reducer.cpp:1] again\n")
    # Another rank's label, a longer number, the label inside a line: ours goes on as ever.
    assert prefix_lines(b"[rank10]:[W x]\nsays [rank1]: hi\n", b"[rank1]: ") == \
        b"[rank1]: [rank10]:[W x]\n[rank1]: says [rank1]: hi\n"
    assert prefix_lines(b"[rank3]:[W y]", b"[rank3]: ") == b"[rank3]:[W y]"  # no newline (a long line's cut)


def _writes(code: str) -> list:
    """Each write(2) a Python process under PYTHONUNBUFFERED (as Metaflow runs a task) makes to its stdout
    and stderr, apart: both are one SOCK_SEQPACKET socket, which keeps every write a message of its own."""
    ours, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(os.environ, PYTHONUNBUFFERED="x", PYTHONPATH=REPO)
    try:
        proc = subprocess.run([PY, "-c", code], stdout=its, stderr=its, env=env, timeout=60)
    finally:
        its.close()
    messages = []
    while True:
        message = ours.recv(1 << 16)
        if not message:
            break
        messages.append(message.decode())
    ours.close()
    assert proc.returncode == 0, messages
    return messages


def test_a_steps_print_is_one_write_so_another_node_cannot_land_inside_it():
    """Two local nodes print to one pipe: ``print`` wrote "text" and "\\n" apart, and the other node's
    line came in between ("node 0 saysnode 1 says", then an empty line)."""
    show = "print('node 0 says %s'); print('to stderr', file=sys.stderr); print('a', 'b', sep=' *')" % STARS
    assert _writes("import sys\n" + show) == ["node 0 says %s" % STARS, "\n", "to stderr", "\n", "a", " *", "b", "\n"]
    ours = "import sys\nfrom metaflow_extensions.torchrun.plugins.torchrun.procs.relay import whole_line_prints\n"
    assert _writes(ours + "whole_line_prints()\n" + show) == \
        ["node 0 says %s\n" % STARS, "to stderr\n", "a *b\n"]


def test_a_line_of_ours_is_one_write():
    code = ("from metaflow_extensions.torchrun.plugins.torchrun.host.console import say\n"
            "say('the control speaks: %s')\n" % STARS)
    assert _writes(code) == ["@torchrun: the control speaks: %s\n" % STARS]


PRINT = """
import metaflow.cli as cli
from metaflow.exception import MetaflowException
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument, print_as_written

if %r:
    print_as_written()
    print_as_written()  # twice: once in effect
cli.print_metaflow_exception(TorchrunInvalidArgument(%r))
cli.print_metaflow_exception(MetaflowException("Metaflow's own *highlight*"))
try:
    raise ValueError(%r)
except ValueError as e:
    cli.print_unknown_exception(e)
"""


def _printed(tmp_path, fixed: bool) -> str:
    script = tmp_path / ("fixed.py" if fixed else "as_metaflow.py")  # a file: the traceback shows its lines
    script.write_text(PRINT % (fixed, STARS, STARS))
    proc = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_metaflow_prints_our_error_and_a_traceback_with_their_asterisks(tmp_path):
    before = _printed(tmp_path, False)  # Metaflow's own: each pair of stars taken for a highlight, and dropped
    assert STARS not in before and "from 0 to 253" in before, before
    after = _printed(tmp_path, True)
    lines = after.splitlines()
    assert lines[0].strip() == "@torchrun: invalid argument:", lines  # Metaflow's layout: headline, location
    assert lines[1] == "    " + STARS, lines  # indented, as Metaflow prints a message
    assert "Metaflow's own highlight" in after  # another error as Metaflow prints it
    assert "Internal error" in after and "ValueError: " + STARS in after
    assert "raise ValueError(%r)" % STARS in after  # the traceback's source line too
    assert after.count(STARS) == 3, after  # the message, the source line, the exception
