"""Every setting of the step reaches the place it takes effect, checked at the
call site (the real ``NodeLaunch``, ``RanksRun`` and ``GangSession``) with a value other
than its default: a setting dropped on the way (``shutdown_grace`` once never
reached torchrun) fails here, not on a cluster."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.base import defaults as DEFAULTS
from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity
from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import Topology
from metaflow_extensions.torchrun.plugins.torchrun.host.logs import retention_policy
from metaflow_extensions.torchrun.plugins.torchrun.host.retention import RetentionPolicy
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import Knobs
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import join_timeout
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults, plan_call
from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import Accelerators
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import ARGS_FILE
from metaflow_extensions.torchrun.plugins.torchrun.procs import entry, names
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import CallPlan
from metaflow_extensions.torchrun.plugins.torchrun.runtime import ranks_run
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_launch import NodeLaunch, RanksStart
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_snapshots import CallSnapshots
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_stacks import CallStacks
from metaflow_extensions.torchrun.plugins.torchrun.runtime.context import StepContext
from metaflow_extensions.torchrun.plugins.torchrun.runtime.ranks_run import RanksRun
from metaflow_extensions.torchrun.plugins.torchrun.runtime.restarts import CallRestarts
from metaflow_extensions.torchrun.plugins.torchrun.runtime.session import GangSession
from plans import node_facts

# Each setting of Metaflow's configuration (knobs.py) at a value no default has,
# and where it is checked: below, or in test_decorator_hooks.py for those the
# decorator itself hands on.
KNOBS = Knobs(
    port=29998,  # the gang's main port where @torchrun(port) is unset (test_decorator_hooks)
    secret=b"k" * 32,  # the gang's secret, in place of a stored one (test_decorator_hooks)
    progress_seconds=3.0,  # the gang config
    straggler_ratio=2.5,  # the gang config
    straggler_seconds=60.0,  # the gang config
    keep_logs_hours=1.0,  # the call's retention of logs
    keep_logs=4,  # the call's retention of logs
    max_log_mb=9.0,  # the call's retention of logs
    debug=True,  # the debug channel (test_decorator_hooks)
    node_history=(1, 3),  # the control's node history (runtime/preflight.py)
    node_history_runs=0,  # the control's node history
    flight_recorder=300,  # the ranks' environment
    warm_start=False,  # the call's warm process
    trainer_progress=False,  # the ranks' entry file
    arrivals=False,  # the ranks' entry file
)

# Each field at a value no default has, and where the test below looks for it.
CHANGED = dict(
    nproc_per_node=3,  # the plan's nproc
    torchrun_args={"monitor_interval": 0.5},  # torchrun's argv
    port=29999,  # the gang's port: the topology (gang/topology.py), not a StepDefaults reader
    derived_nproc=5,  # the plan's nproc when nothing else is given (test_inputs)
    accelerators=Accelerators(kind="gpu", count=5, source="@resources(gpu=5)"),  # the device check
    heartbeat_timeout=7.0,  # the session's gang config
    start_timeout=123.0,  # the gang config and torchrun's rendezvous wait
    label_logs=False,  # the ranks' environment
    hang_timeout=9.0,  # the gang config
    shutdown_grace=47.0,  # the ranks' environment and the supervisor
    rdzv_port=29777,  # the plan
    args_as="0.2",  # the plan's encoding of entrypoint_args
    preflight="full",  # the session's preflight (runtime/preflight.py)
    restarts=2,  # the gang config (the service decides restarts) and a restart's launch
    retry_on="infrastructure",  # the plan: a call's own max_restarts refused (below)
    spares=1,  # the gang config (the service's bench), the session's bench and torchrun's nnodes (below)
    snapshot_every=25,  # the call's snapshot store: the ranks' environment (below)
    snapshot_memory=64.0,  # the call's snapshot store's budget (below)
    min_nodes=1,  # the gang config (the service shrinks the gang: tests/unit/test_node_loss.py)
    regrow=False,  # the gang config (the service grows it back: tests/unit/test_node_loss.py)
    swap_stragglers=30.0,  # the gang config (the service swaps a late rank's node: tests/unit/test_arrivals.py)
    knobs=KNOBS,  # each checked where it takes effect (KNOBS above)
)


def test_every_setting_of_the_step_is_covered_here():
    fields = {f.name for f in dataclasses.fields(StepDefaults)}
    assert fields == set(CHANGED), "a new @torchrun setting needs a call-site test here"
    for name, value in CHANGED.items():
        default = getattr(StepDefaults(), name)
        assert value != default, name
    for knob in dataclasses.fields(Knobs):
        assert getattr(KNOBS, knob.name) != getattr(Knobs(), knob.name), "a new setting needs a test: " + knob.name


class Call:
    """A call's launch as ``CallRun`` makes it (call 0, the pinned port 29777), on a step's session
    that joined no gang: the first start as ``prepare`` makes it, and the ranks' run."""

    def __init__(self, session: GangSession, plan: CallPlan) -> None:
        self.session, self.plan = session, plan
        defaults = session.context.defaults  # the call's snapshot store, as CallRun makes it
        no_peers = SimpleNamespace(secret=b"", news=SimpleNamespace(snapshot_peers=lambda index: None))
        self.snapshots = CallSnapshots(no_peers, 0, defaults.snapshot_every, defaults.snapshot_memory,  # type: ignore[arg-type]
                                       "127.0.0.1")
        self.launch = NodeLaunch(session, plan, 0, self.snapshots)
        self.start: Optional[RanksStart] = None

    def prepare(self) -> Dict[str, str]:
        self.start = self.launch.prepare(None, 29777)
        return self.start.env

    @property
    def argv(self) -> List[str]:
        assert self.start is not None
        return list(self.start.argv)

    @property
    def workdir(self) -> str:
        return self.launch.workdir

    def ranks(self, client: Any = None) -> RanksRun:
        return RanksRun(self.session, client, 0, self.launch, CallRestarts(), CallStacks(), None)


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # chosen from TMPDIR here, forgotten after: not a later test's
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    defaults = StepDefaults(**CHANGED)
    identity = GangIdentity("F", "1", "train", "2", 0)
    topology = Topology(num_nodes=2, node_index=0, main_addr="127.0.0.1", ports=(29999,), is_local=True)
    session = GangSession(StepContext(identity, defaults, topology, b"s" * 32, flow_dir=str(tmp_path)))
    plan = plan_call(str(script), {"epochs": True}, None, None, defaults, [str(tmp_path)])
    call = Call(session, plan)
    yield call
    if call.launch.files is not None:
        call.launch.files.close()


def _changed(run, **context):
    """The fixture's call on a step whose context differs in ``context`` (a context is never changed)."""
    return Call(GangSession(dataclasses.replace(run.session.context, **context)), run.plan)


def test_retry_on_reaches_the_plan_of_a_call(tmp_path):
    """retry_on="infrastructure", as StepDefaults carries it, refuses a call's
    own max_restarts (torch would rerun a bug); without it the call plans."""
    from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    asked = {"max_restarts": 1}
    with pytest.raises(TorchrunInvalidArgument, match="retry_on='infrastructure'"):
        plan_call(str(script), None, None, asked, StepDefaults(retry_on=CHANGED["retry_on"]), [str(tmp_path)])
    planned = plan_call(str(script), None, None, asked, StepDefaults(), [str(tmp_path)])
    assert planned.options["max-restarts"] == 1 and planned.torch_restarts  # carried: prepare reads it


def test_the_session_carries_the_gang_settings(run):
    config = run.session.config
    assert (config.heartbeat_timeout, config.start_timeout, config.hang_timeout) == (7.0, 123.0, 9.0)
    assert config.restarts == 2
    assert config.spares == 1 and run.session.bench.spares == (1,)  # of 2 nodes: node 1 waits
    assert config.min_nodes == 1 and config.regrow is False and config.swap_stragglers == 30.0
    assert (config.progress_interval, config.straggler_ratio, config.straggler_seconds) == (3.0, 2.5, 60.0)


def test_a_call_keeps_its_logs_and_starts_its_ranks_as_the_settings_say(run):
    run.prepare()
    assert run.launch.files is not None and retention_policy(run.launch.files.knobs) == RetentionPolicy(
        keep=4, hours=1.0, max_bytes=9 * 1024 * 1024, young_seconds=retention_policy().young_seconds)
    assert run.launch.warm is not None and run.launch.warm.path == "" and run.launch.warm.pid is None  # warm_start=False
    assert names.ZYGOTE_ENV not in run.launch.start(None, 29777, 0).env
    read = entry.read_entry(run.launch.entry[0])  # what the ranks read of the settings
    assert read.trainer_progress is False and read.arrivals is False


def test_a_call_keeps_snapshots_as_the_settings_say(run):
    """snapshot_every reaches the ranks (the trainers' interval), snapshot_memory the node's store."""
    run.prepare()
    assert names.SNAPSHOT_ENV not in run.launch.start(None, 29777, 0).env  # not open: nothing to reach
    assert run.snapshots.open() is None  # no gang's secret: no port for peers
    try:
        assert run.snapshots.store is not None and run.snapshots.store.budget == 64 << 20
        why, _budget = run.snapshots.store.shelf.plan("local-0", 24 << 20, ranks=4)  # 3 x 24 MB > 64 MB
        assert why is not None and "budget is 64.0 MB (@torchrun(snapshot_memory=64))" in why, why
        env = run.launch.start(None, 29777, 0).env
        assert env[names.SNAPSHOT_EVERY_ENV] == "25" and env[names.SNAPSHOT_ENV] == run.snapshots.store.path
        held = os.path.dirname(run.snapshots.store.path)
        assert os.path.isdir(held)
    finally:
        run.launch.release()
    assert run.snapshots.store is None and not os.path.exists(held)  # closed with the call: every snapshot freed


@pytest.mark.parametrize("every, restarts, why", [(None, 2, names.OFF_BY_SETTING), (None, 0, names.OFF_NO_RESTARTS),
                                                   (25, 2, names.OFF_ON_NODE)])
def test_with_no_store_the_ranks_are_told_why_in_place_of_a_socket(every, restarts, why):
    """snapshots=False, no restart to serve, or a store that could not start: ``snapshot.save``/``load`` say
    which, once, instead of naming the variable that is unset."""
    no_peers = SimpleNamespace(secret=b"", news=SimpleNamespace(snapshot_peers=lambda index: None))
    off = CallSnapshots(no_peers, 0, every, None, "127.0.0.1", restarts)  # type: ignore[arg-type]
    assert off.environ() == {names.SNAPSHOTS_OFF_ENV: why}


KILLED_WITH_A_STORE = """
import os, sys, time
from types import SimpleNamespace
from metaflow_extensions.torchrun.plugins.torchrun.runtime.call_snapshots import CallSnapshots
no_peers = SimpleNamespace(secret=b"", news=SimpleNamespace(snapshot_peers=lambda index: None))
snapshots = CallSnapshots(no_peers, 0, 0, 16, "127.0.0.1", 1)
snapshots.open()
print(snapshots.store.path, flush=True)
time.sleep(600)
"""


def test_a_store_killed_with_its_task_is_left_where_the_next_call_sweeps_it(tmp_path, monkeypatch):
    """A node lost (its task SIGKILLed) runs no ``close``: the store's socket directory was a ``mkdtemp`` in
    TMPDIR, left there for good (19 ``mftr-snap-*`` after an afternoon). It is a work directory of its own
    now, held while the task lives: the next call's sweep removes it once it is no longer young."""
    import signal
    import subprocess
    import sys
    import time

    from metaflow_extensions.torchrun.plugins.torchrun.host import private
    from metaflow_extensions.torchrun.plugins.torchrun.host.workdirs import prune_work_dirs, work_root

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    child = subprocess.Popen([sys.executable, "-c", KILLED_WITH_A_STORE], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        socket_path = child.stdout.readline().strip()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    held = os.path.dirname(socket_path)
    root = work_root()
    assert os.path.dirname(held) == root and os.path.exists(socket_path), (socket_path, root)
    assert not [n for n in os.listdir(str(tmp_path)) if n.startswith("mftr-snap")], os.listdir(str(tmp_path))
    assert prune_work_dirs(root) == []  # young: another node of a local run may be making it now
    old = time.time() - private.YOUNG_SECONDS - 1
    os.utime(held, (old, old))
    assert prune_work_dirs(root) == [held] and not os.path.exists(held)


def test_the_control_reads_its_node_history_as_the_settings_say(run):
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.preflight import History

    history = History("F", "1", "train", None, KNOBS)
    assert (history.threshold.culprit, history.threshold.appearances, history.runs) == (1, 3, 0)
    assert history.get() == []  # no past run read (node_history_runs=0)
    assert History("F", "1", "train", None, Knobs(node_history=None)).threshold is None


def test_spares_leave_torchrun_the_active_nodes(run):
    run.prepare()
    nnodes = [a for a in run.argv if a.startswith("--nnodes")]
    assert nnodes == ["--nnodes=1"] or run.argv[run.argv.index("--nnodes") + 1] == "1", run.argv


def test_the_plan_carries_the_call_settings(run):
    assert run.plan.nproc == 3
    assert run.plan.rdzv_port == 29777
    assert str(run.plan.options["monitor-interval"]) == "0.5"
    assert run.plan.entry_argv == ["--epochs", "true"]  # args_as="0.2"


def test_the_ranks_environment_and_argv_carry_the_launch_settings(run):
    env = run.prepare()
    assert env[names.SHUTDOWN_TIMEOUT_ENV] == "47"
    assert env[names.LABELS_ENV] == "0"
    assert env[names.NODE_INDEX_ENV] == "0"
    assert env[names.WORK_DIR_ENV] == run.workdir and os.path.isdir(run.workdir)
    argv = " ".join(run.argv)
    assert "--monitor-interval 0.5" in argv
    assert "--nproc-per-node 3" in argv or "--nproc-per-node=3" in argv
    assert str(join_timeout(123.0)) in argv and str(join_timeout(DEFAULTS.START_TIMEOUT)) not in argv
    assert "127.0.0.1:29777" in argv


def test_a_restart_launches_its_own_rendezvous_and_says_which_restart_it_is(run):
    first = run.prepare()
    assert names.RESTART_ENV not in first
    first_id = run.argv[run.argv.index("--rdzv-id") + 1]
    again = run.launch.start(None, 29555, 2)  # as the call's restart 2 asks it (RestartLoop.apply)
    assert again.env[names.RESTART_ENV] == "2" and again.restart == 2 and again.rdzv_port == 29555
    argv = " ".join(again.argv)
    assert "127.0.0.1:29555" in argv and "--rdzv-backend static" in argv and "--node-rank 0" in argv
    assert again.argv[again.argv.index("--rdzv-id") + 1] == first_id + "-r2"


def test_a_node_waits_for_node_0s_store_at_the_endpoint_its_launch_was_given(run, monkeypatch):
    """The endpoint comes beside the argv (``NodeStart``), never read back out
    of it: a launch that parsed its own argv again waits at the argv's."""
    from metaflow_extensions.torchrun.plugins.torchrun.runtime import call_launch

    run.prepare()
    start = call_launch.prepare_launch(run.plan, run.session.context.defaults, node_facts(rdzv_port=29555), os.environ)
    assert start.argv[start.argv.index("--rdzv-endpoint") + 1] == start.rdzv_endpoint == "127.0.0.1:29555"
    waited = []
    monkeypatch.setattr(call_launch, "prepare_launch", lambda *a: start._replace(rdzv_endpoint="10.9.8.7:1234"))
    monkeypatch.setattr(call_launch, "wait_listening", lambda endpoint, seconds: waited.append(endpoint))
    run = _changed(run, topology=dataclasses.replace(run.session.context.topology, node_index=1))  # not the store's node
    run.prepare()
    run.launch.warm = type("Warm", (), {"for_ranks": lambda self, env, n: dict(env, **{names.ZYGOTE_ENV: "z"})})()
    run.launch.start(run.session.bench.seat(0, 2), 29555, 0)  # a seat that trains (node 1 is the spare)
    run.launch.files.close()
    assert waited == ["10.9.8.7:1234"]


class CountsPickles:
    pickled = 0

    def __reduce__(self):
        CountsPickles.pickled += 1
        return (CountsPickles, ())


def train(x):
    """A module-level function: a call's entrypoint."""


def test_a_functions_arguments_are_pickled_once_and_reach_the_ranks_as_planned(run, tmp_path):
    CountsPickles.pickled = 0
    run.launch.plan = plan_call(train, [CountsPickles()], 1, None, StepDefaults(), [str(tmp_path)])
    run.launch.prepare(run.session.bench.seat(0, 2), 29777)
    with open(os.path.join(run.launch.workdir, ARGS_FILE), "rb") as f:
        assert f.read() == run.launch.plan.function_pickle
    assert CountsPickles.pickled == 1  # by planning's check; the launch writes those bytes


def test_a_local_runs_control_alone_prunes_the_hosts_other_runs(run):
    """Its nodes share its host: a second scan of every run's directory there finds nothing more."""
    assert run.ranks().prunes  # the control
    for index, local, prunes in ((1, True, False), (1, False, True)):
        topology = dataclasses.replace(run.session.context.topology, node_index=index, is_local=local)
        assert _changed(run, topology=topology).ranks().prunes is prunes


def test_the_supervisor_gets_the_grace(run, monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def supervisor(*args, **kwargs):
        seen.update(kwargs)
        raise Stop()

    monkeypatch.setattr(ranks_run, "Supervisor", supervisor)
    client = type("Client", (), {"cause": None, "quiet": None, "send_stacks": lambda *a: None})()
    with pytest.raises(Stop):
        run.ranks(client).run(RanksStart(0, None, 29777, ("torchrun",), {}))
    assert seen["shutdown_grace"] == 47.0


@pytest.mark.parametrize("knob, theirs, expected", [
    (None, {}, {names.FR_BUFFER_ENV: str(DEFAULTS.FLIGHT_RECORDER_ENTRIES)}),
    (300, {}, {names.FR_BUFFER_ENV: "300"}),
    (0, {}, {names.FR_BUFFER_ENV: "0"}),  # "off": torch 2.13 records unless told 0
    (300, {names.FR_BUFFER_ENV: "7"}, {names.FR_BUFFER_ENV: "7"}),  # the user's own setting stands
    (300, {names.FR_BUFFER_OLD_ENV: "0"}, {names.FR_BUFFER_OLD_ENV: "0"}),  # so does torch's older name
])
def test_the_flight_recorder_knob_reaches_the_ranks(run, monkeypatch, knob, theirs, expected):
    for name in (names.FR_BUFFER_ENV, names.FR_BUFFER_OLD_ENV):
        monkeypatch.delenv(name, raising=False)
    knobs = KNOBS if knob is not None else Knobs()
    run = _changed(run, defaults=dataclasses.replace(run.session.context.defaults, knobs=dataclasses.replace(
        knobs, flight_recorder=knob if knob is not None else knobs.flight_recorder)))
    for name, value in theirs.items():
        monkeypatch.setenv(name, value)
    env = run.prepare()
    run.launch.release()
    assert {n: env[n] for n in (names.FR_BUFFER_ENV, names.FR_BUFFER_OLD_ENV) if n in env} == expected


def test_a_call_uses_what_the_session_found_of_the_host(run, tmp_path):
    """The step's context holds the route and the base directory, found once per step; each call uses them."""
    from metaflow_extensions.torchrun.plugins.torchrun.host.basedir import base_dir

    (tmp_path / "elsewhere").mkdir()
    run = _changed(run, route=("10.9.8.7", "eth9"), host_base=base_dir(str(tmp_path / "elsewhere")))
    context = run.session.context
    env = run.prepare()
    assert run.launch.local_addr == "10.9.8.7" and env["GLOO_SOCKET_IFNAME"] == "eth9"
    assert "10.9.8.7" in " ".join(run.argv)
    assert run.workdir.startswith(context.host_base + os.sep)
    run.launch.release()
