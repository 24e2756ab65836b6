"""The failure block at 16 nodes x 8 processes (issue 36), simulated: the
messages the failing node and the control build from 128 ranks' records and
stacks, printed as Metaflow prints a step's error. At most 30 lines, whatever
the gang's size; the root cause's traceback once; no frame of ours."""

from __future__ import annotations

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.errors import GangAborted, TorchrunFailed, rank_raised
from metaflow_extensions.torchrun.plugins.torchrun.procs import failure_block
from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import RankFailure

NODES, NPROC = 16, 8
ROOT_NODE, ROOT_RANK = 5, 42
SCREEN = 30

DEEP = "".join('  File "/home/me/train.py", line %d, in layer%d\n    x = layer%d(x)\n' % (10 + i, i, i + 1)
               for i in range(20))
ROOT_TB = ("Traceback (most recent call last):\n" + DEEP
           + '  File "/home/me/train.py", line 99, in loss_step\n    raise ValueError("saw a NaN")\n'
           + "ValueError: saw a NaN\n")
ECHO_TB = ("Traceback (most recent call last):\n  File \"/home/me/train.py\", line 50, in step\n    loss.backward()\n"
           "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
           "[10.0.0.5]:4242\n")


def rank_failure(rank: int, root: bool = False) -> RankFailure:
    return RankFailure(rank=rank, local_rank=rank % NPROC, node_index=rank // NPROC, host="ip-10-0-0-%d" % (rank // NPROC),
                       pid=1000 + rank, exc_type="ValueError" if root else "RuntimeError",
                       message="saw a NaN" if root else "[/pytorch/gloo/pair.cc:553] Connection closed by peer",
                       traceback=ROOT_TB if root else ECHO_TB, timestamp=100.0 + (0 if root else 1 + rank))


def dump(place: int) -> str:
    return ("Current thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2800 in all_reduce\n'
            '  File "/home/me/train.py", line %d in step\n  File "/home/me/train.py", line 120 in <module>\n' % (40 + place))


def gang_stacks() -> dict:
    """128 ranks: most in one all_reduce, a few odd ones out at 9 other places."""
    return {r: dump(0 if r % 13 else r % 10) for r in range(NODES * NPROC) if r != ROOT_RANK}


def as_metaflow_prints(error) -> list:
    """cli.print_metaflow_exception: the headline line, the message, a blank line."""
    return ["%s:" % error.headline] + error.message.splitlines() + [""]


def check(lines: list) -> str:
    text = "\n".join(lines)
    assert len(lines) + 1 <= SCREEN, "%d lines:\n%s" % (len(lines) + 1, text)  # + "<flow ...> failed:"
    assert "metaflow_extensions" not in text and "torch/distributed/elastic" not in text
    return text


def test_the_failing_nodes_error_at_16_by_8_fits_one_screen():
    failures = [rank_failure(r, root=(r == ROOT_RANK)) for r in range(ROOT_NODE * NPROC, (ROOT_NODE + 1) * NPROC)]
    error = TorchrunFailed(1, ROOT_NODE, failures, stacks=gang_stacks(),
                           logs="This node's ranks' output, whole: /tmp/logs/x on ip-10-0-0-5", host="ip-10-0-0-5")
    text = check(as_metaflow_prints(error))
    assert text.count('raise ValueError("saw a NaN")') == 1
    assert text.index("First failure: node 5 (ip-10-0-0-5), rank 42") < text.index("ValueError: saw a NaN")
    # The 7 echoes in one line, with their count, the gloo path left out.
    echoes = [line for line in text.splitlines() if "echoes" in line]
    assert echoes == ["7 other ranks failed as echoes of it (RuntimeError: Connection closed by peer): "
                      "ranks 40, 41, 43-47; their tracebacks are in their logs"]
    # Then one line per place (the odd ones out first), counted past 5; then the logs.
    assert text.index("echoes") < text.index("Where the other ranks were") < text.index("output, whole")
    assert "... and 5 more places" in text
    assert "lines above are in the rank's log" in text  # the deep traceback, its innermost frames kept


def test_the_controls_error_at_16_by_8_fits_one_screen():
    root = rank_failure(ROOT_RANK, root=True)
    cause = Cause(CauseKind.RANK_FAILED, "node 5 (ip-10-0-0-5), rank 42 (local rank 2, pid 1042): ValueError: saw a NaN",
                  node_index=ROOT_NODE, rank=ROOT_RANK, exc_type="ValueError", message="saw a NaN",
                  traceback=root.traceback)
    error = GangAborted(0, cause, -15, same_log=False, stacks=gang_stacks(), logs="This node's ranks' output: /x")
    text = check(as_metaflow_prints(error))
    assert text.count('raise ValueError("saw a NaN")') == 1
    # On a local run the failing node's error is in the same log: one line here.
    local = GangAborted(0, cause, -15, same_log=True)
    assert len(local.message.splitlines()) == 1 and "Traceback" not in local.message


def test_a_functions_exception_keeps_its_type_and_prints_as_the_block():
    failures = [rank_failure(r, root=(r == ROOT_RANK)) for r in range(ROOT_NODE * NPROC, (ROOT_NODE + 1) * NPROC)]
    error = TorchrunFailed(1, ROOT_NODE, failures, stacks=gang_stacks())
    raised = rank_raised(ValueError("[rank 42] saw a NaN"), error)
    assert isinstance(raised, ValueError) and isinstance(raised, TorchrunFailed)
    assert type(raised).__name__ == "ValueError" and str(raised) == "[rank 42] saw a NaN"
    assert raised.args == ("[rank 42] saw a NaN",) and raised.root_cause.rank == ROOT_RANK
    assert raised.__cause__ is None and raised.__suppress_context__
    check(as_metaflow_prints(raised))
    import pickle

    back = pickle.loads(pickle.dumps(raised))  # e.g. kept as an artifact: the user's own type
    assert type(back) is ValueError and back.args == raised.args

    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)
            self.b = b

    odd = rank_raised(Odd(1, 2), error)
    assert isinstance(odd, Odd) and odd.b == 2 and odd.args == (1, 2)
    oserror = rank_raised(FileNotFoundError(2, "no such file"), error)
    assert isinstance(oserror, FileNotFoundError) and oserror.errno == 2


def test_the_block_is_bounded_whatever_it_is_given():
    many = [rank_failure(r) for r in range(4096)]
    own = [rank_failure(r, root=True) for r in range(50)]
    block = failure_block.Block(root=own[0], others=own[1:] + many, stacks={r: dump(r) for r in range(4096)},
                                logs="logs", fix="Fix: a\nb\nc\nd", headline="First failure: ...")
    assert len(failure_block.render(block).splitlines()) <= failure_block.BUDGET


def test_the_echoes_of_other_nodes_are_counted_in_the_same_line():
    failures = [rank_failure(r, root=(r == ROOT_RANK)) for r in range(ROOT_NODE * NPROC, (ROOT_NODE + 1) * NPROC)]
    others = [r for r in range(NODES * NPROC) if r // NPROC != ROOT_NODE]
    error = TorchrunFailed(1, ROOT_NODE, failures, elsewhere=others)
    echoes = [line for line in error.message.splitlines() if "echoes" in line]
    assert len(echoes) == 1 and echoes[0].startswith("127 other ranks failed as echoes of it (RuntimeError: ")
    cause = Cause(CauseKind.RANK_FAILED, "node 5 ...", node_index=ROOT_NODE, rank=ROOT_RANK)
    aborted = GangAborted(0, cause, same_log=False, elsewhere=list(range(NODES * NPROC)))
    assert "127 other ranks failed as echoes of it: ranks 0-41, 43-127" in aborted.message


def test_a_crash_dump_keeps_its_first_lines_without_our_frames():
    ours = failure_block._OURS + "procs/bootstrap.py"
    dump = ("The rank's last lines of stderr:\nFatal Python error: Segmentation fault\n\n"
            "Current thread 0x00007f7882e60b80 (most recent call first):\n"
            '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
            '  File "/w/segfault.py", line 19 in <module>\n'
            '  File "<frozen runpy>", line 88 in _run_code\n'
            '  File "%s", line 256 in _main\n' % ours)
    lines = failure_block.traceback_lines(dump)
    assert lines[:2] == ["The rank's last lines of stderr:", "Fatal Python error: Segmentation fault"]
    assert lines[-1] == '  File "/w/segfault.py", line 19 in <module>'
    long = failure_block.traceback_lines(dump + "".join("  File \"/w/x.py\", line %d in f\n" % i for i in range(40)))
    assert len(long) == failure_block.TRACEBACK_LINES and long[1].startswith("Fatal Python error")
    assert long[-1] == "... 35 more lines in the rank's log"


def test_torch_s_text_is_cut_where_a_word_ends():
    """A user saw "(RuntimeError: ... This is typically caused by a r…)": the
    echo's message is cut at a word boundary, as is an other failure's line."""
    said = ("Connection closed by peer [127.0.0.1]:30171. This is typically caused by a remote peer having "
            "exited or a network failure")
    echo = RankFailure(rank=1, local_rank=1, node_index=0, host="h", pid=7, exc_type="RuntimeError",
                       message="[/pytorch/gloo/pair.cc:534] " + said, traceback="", timestamp=1.0)
    own = RankFailure(rank=2, local_rank=0, node_index=1, host="h", pid=8, exc_type="KeyError",
                      message="no such key in the batch: 'labels'; the loader gave only the inputs and their "
                              "masks, which is typically caused by a collate_fn that drops it", traceback="",
                      timestamp=1.0)
    assert echo.secondary and not own.secondary
    echoes, also = failure_block.echo_lines([echo, own])
    for line, whole, head in ((echoes, "RuntimeError: " + said, "echoes of it ("),
                              (also, "KeyError: " + own.message, "(node 1): ")):
        shown = line.split(head, 1)[1].split("): rank 1")[0]
        assert shown.endswith("…") and whole.startswith(shown[:-1]) and whole[len(shown) - 1] == " ", line


def test_a_sigkilled_rank_is_not_said_to_have_a_traceback():
    """A SIGKILL leaves no traceback: the other node's line on the same log
    says where the error is, and claims a traceback only where there is one."""
    killed = "node 1 (h), rank 3 (local rank 1, pid 77): killed by signal SIGKILL"
    said = {}
    for name, tb in (("none", None), ("crash", failure_block.CRASH_OUTPUT + ":\nSegmentation fault"),
                     ("traceback", ROOT_TB)):
        cause = Cause(CauseKind.RANK_FAILED, killed, node_index=1, rank=3, traceback=tb)
        said[name] = str(GangAborted(0, cause, same_log=True)).splitlines()[0]
    assert said["none"] == "node 0 stopped because node 1 failed first (its error is in this log): " + killed
    assert "(its error in this log has the rank's last lines of stderr)" in said["crash"]
    assert "(its error in this log has the traceback)" in said["traceback"]


def test_a_hang_s_stopped_ranks_are_not_echoes_and_its_suspect_is_named_once():
    """The gang stopped every rank of a hung call: the other nodes' ranks that
    ended are not "failed as echoes of it" (a user saw the suspect listed there)."""
    hang = Cause(CauseKind.HANG, "no output from any rank for 20 s (hang_timeout=20s), in call 1")
    suspects = ["Suspected cause: rank 3 is not in the all_reduce that ranks 0-2 wait in (from the stacks):",
                "  rank 3 (node 1, h): skip.py:9 in <module>"]
    text = str(GangAborted(0, hang, same_log=True, elsewhere=[2, 3], suspects=suspects))
    assert "echoes" not in text and text.count("rank 3") == 2, text
    lost = Cause(CauseKind.NODE_LOST, "node 1 (h) lost its connection", node_index=1)
    assert "2 other ranks failed as echoes of it: ranks 2, 3" in str(GangAborted(0, lost, elsewhere=[2, 3]))


def test_a_refused_attempt_is_said_once_on_node_0_and_in_one_line_on_the_others():
    why = "attempt 1 ran nothing: attempt 0 failed in your code, ValueError at train.py:88, and ..."
    cause = Cause(CauseKind.STEP_FAILED, "node 0: " + why, node_index=0, exc_type="TorchrunNotRetried", message=why)
    local, cluster = GangAborted(1, cause, same_log=True), GangAborted(1, cause, same_log=False)
    assert str(local) == "node 1 ran nothing: node 0's error in this log says why"
    assert str(cluster) == "node 1 ran nothing: " + why  # its own log has nothing else
    assert local.headline == cluster.headline == "@torchrun: not retried"
