"""The end of torchrun's agent (issue 52): the store's host waits until every
other agent is done with its store (departure.py, on a real TCPStore), and the
agent's native stderr goes to its log while its workers' and its own Python
tracebacks stay on the console (agent.native_stderr_to_log, in a real process)."""

import datetime
import os
import subprocess
import sys
import threading

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.procs import departure

@pytest.fixture
def stores():
    """A TCPStore server on loopback and a client of it per guest. torch imported here, not as
    the file is collected: a collection without torch is 1.3 CPU-s less in every test worker."""
    torch_distributed = pytest.importorskip("torch.distributed")
    server = torch_distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                        timeout=datetime.timedelta(seconds=30))
    clients = [torch_distributed.TCPStore("127.0.0.1", server.port, is_master=False,
                                          timeout=datetime.timedelta(seconds=30)) for _ in range(2)]
    yield server, clients
    del clients, server


@pytest.fixture
def seen():
    kept = list(departure._SEEN)
    yield departure._SEEN
    departure._SEEN[:] = kept


def test_the_host_waits_until_every_guest_is_done_with_its_store(stores, seen):
    server, clients = stores
    result = []
    waiting = threading.Thread(target=lambda: result.append(departure.wait_for_guests(server, 2, wait=120)))
    waiting.start()
    seen[:] = [(clients[0], 3)]  # three agents: the host and two guests
    assert departure.depart(False, wait=120) is True  # guest 1 is done with the store
    assert not result  # one guest is not all of them
    seen[:] = [(clients[1], 3)]
    assert departure.depart(False, wait=120) is True  # guest 2
    waiting.join(timeout=60)
    assert result == [True]
    seen[:] = [(server, 3)]
    assert departure.depart(True, wait=0) is True  # the host counts every agent but itself


def test_the_wait_is_bounded(stores, seen):
    server, clients = stores
    clients[0].add(departure.DONE_KEY, 1)
    assert departure.wait_for_guests(server, 2, wait=0.1) is False  # the second guest never came
    seen[:] = [(server, 3)]
    assert departure.depart(True, wait=0.1) is False


def test_nothing_to_do_where_no_exit_barrier_ran(seen):
    seen[:] = []
    assert departure.depart(True, wait=120) is None
    assert departure.depart(False, wait=120) is None


def test_a_store_gone_wrong_is_not_raised(seen):
    class Broken:
        def add(self, key, amount):
            raise RuntimeError("connection closed")

    seen[:] = [(Broken(), 2)]
    assert departure.depart(False, wait=120) is False
    assert departure.depart(True, wait=120) is False


def test_the_exit_barrier_is_watched_once(seen):
    seen[:] = []

    class Group:
        group_world_size = 4

    class Agent:
        _store = "the store"
        _worker_group = Group()

        def _exit_barrier(self):
            return "barrier passed"

    assert departure.watch_exit_barrier(Agent)
    assert not departure.watch_exit_barrier(Agent)  # once
    assert Agent()._exit_barrier() == "barrier passed"
    assert seen == [("the store", 4)]


NATIVE = r"""
import os, sys
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
from metaflow_extensions.torchrun.plugins.torchrun.procs import agent

log = agent.quiet_launcher(sys.argv[1])
assert agent.native_stderr_to_log(log)
os.write(2, b"a native line on fd 2\n")  # what torch's C++ writes
sys.stderr.write("a python line of the agent\n")
worker = "import sys; sys.stderr.write('a line of a worker\\n')"
SubprocessHandler(sys.executable, ("-c", worker), {}, None, None, 0, None).proc.wait()
redirected = os.path.join(sys.argv[1], "worker.stderr")
SubprocessHandler(sys.executable, ("-c", worker), {}, None, redirected, 0, None).proc.wait()
raise RuntimeError("the agent's own failure")
"""


def test_the_agents_native_stderr_goes_to_its_log_and_the_rest_to_the_console(tmp_path):
    proc = subprocess.run([sys.executable, "-c", NATIVE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    log = (tmp_path / "torchrun-agent.log").read_text()
    assert proc.returncode == 1, proc.stderr
    assert "a native line on fd 2" in log and "a native line on fd 2" not in proc.stderr
    assert "a python line of the agent" in proc.stderr and "a python line" not in log
    assert proc.stderr.count("a line of a worker") == 1 and "worker" not in log  # inherited the console's
    assert (tmp_path / "worker.stderr").read_text() == "a line of a worker\n"  # torch's redirect kept
    assert "RuntimeError: the agent's own failure" in proc.stderr  # its traceback still on the console
    assert "Traceback" not in log


def test_no_log_no_redirect():
    from metaflow_extensions.torchrun.plugins.torchrun.procs import agent

    assert agent.native_stderr_to_log(None) is False


STOPPED_AS_IT_ENDS = r"""
import os, signal, sys
from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from metaflow_extensions.torchrun.plugins.torchrun.procs import agent

def ranks_failed(argv):
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, _terminate_process_handler)  # as torch's PContext.start leaves them
    failure = ProcessFailure(local_rank=0, pid=os.getpid(), exitcode=1, error_file="")
    raise ChildFailedError("train.py", {2: failure})

recorded = agent.record_child_failures

def recorded_then_stopped(directory, error):
    done = recorded(directory, error)
    if sys.argv[2] == "raise":
        raise RuntimeError("something of ours failed as the agent ended")
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # the gang stops this node as its agent ends
    return done

run.main = ranks_failed
agent.record_child_failures = recorded_then_stopped
agent.main(["--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "127.0.0.1:29400", "train.py"])
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "raise"])
def test_a_stop_signal_while_the_agent_ends_prints_no_second_traceback(tmp_path, sig):
    """A node's ranks fail as echoes, and the gang's stop reaches the agent as it
    ends: torch's handler raised in our ending, and a CI run's console got the
    whole ChildFailedError report and a second traceback (132 lines). Anything else
    raised there ends the agent the same way: exit 1, nothing on the console."""
    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import LOG_DIR_ENV, WORK_DIR_ENV

    env = dict(os.environ, **{LOG_DIR_ENV: str(tmp_path), WORK_DIR_ENV: str(tmp_path)})
    proc = subprocess.run([sys.executable, "-c", STOPPED_AS_IT_ENDS, str(tmp_path), sig], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "SignalException" not in proc.stderr, proc.stderr
    log = (tmp_path / "torchrun-agent.log").read_text()
    assert log.count("ChildFailedError") == (sig != "raise"), log  # the cause's text in the node's log, once


SIGNALLED_MID_LINE = r"""
import logging, os, signal, sys
from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler
from metaflow_extensions.torchrun.plugins.torchrun.procs import agent

signal.signal(signal.SIGTERM, _terminate_process_handler)  # as torch's agent leaves it
agent.quiet_launcher(sys.argv[1])
logger = logging.getLogger(agent.LAUNCHER_LOGGERS[0])

class Stopped(logging.Formatter):
    def format(self, record):  # the gang's stop lands as the line is written, as torch's error file is logged
        os.kill(os.getpid(), signal.SIGTERM)
        return super().format(record)

logger.handlers[0].setFormatter(Stopped())
logger.error("no error file defined for parent")
print("went on")
"""


def test_a_stop_signal_inside_a_line_of_torchs_log_prints_nothing_on_the_console(tmp_path):
    """torch's handler raises in the middle of the write; logging would print two tracebacks to stderr."""
    proc = subprocess.run([sys.executable, "-c", SIGNALLED_MID_LINE, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "went on\n", proc.stderr
    assert proc.stderr == ""
