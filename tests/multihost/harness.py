"""A Metaflow flow whose @torchrun step runs with one node per host, each started
the way Kubernetes (a JobSet) or AWS Batch (a multi-node parallel job) starts it.

Sequence (what ``run --with kubernetes`` / ``--with batch`` does, less the
cluster): ``init`` (the _parameters task), the ``start`` step, then one
``step train`` task per host with that platform's environment and per-node
options (``contracts.py``), then the ``join`` step with the input paths the
runtime would give it: the tasks the platform started. Every Metaflow process
runs inside a host (the non-@parallel steps on host 0) and all of them share one
local datastore directory, standing in for S3.

Every process started carries a token in its environment: after the test, a
live process holding it is a leak (tests/our_processes.py, shared by every test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Dict, List, Optional, Sequence

from metaflow.util import compress_list
import client_read
from integration.helpers import worker_warm
from our_processes import TOKEN_VAR, describe, kill_all, leaks, processes_with_token  # noqa: F401 (shared)

from metaflow_extensions.torchrun.plugins.torchrun.procs.names import HOST_ZYGOTE_ENV

from . import contracts
from .netns import Host, Network

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOWS = os.path.join(REPO, "tests", "flows")
EXAMPLES = os.path.join(REPO, "examples")
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform_task.py")

# Task ids are not integers, as on a deployed orchestrator (Argo names a JobSet's
# control task "control-<entropy>-0"): Metaflow's local metadata registers a
# non-integer task id when the task starts, while an integer one is assumed to
# have been registered beforehand by the runtime that allocated it.
PARAMS_TASK, START_TASK, JOIN_TASK, END_TASK = "params", "start", "join", "end"


class Sandbox:
    """One test's directory, token and base environment. The environment is
    built from scratch, as a pod's or a container's is: nothing of the developer's
    shell (METAFLOW_*, GLOO_*, NCCL_*) leaks into the nodes."""

    def __init__(self, tmp_path: str):
        self.tmp = str(tmp_path)
        self.token = uuid.uuid4().hex
        self.cleanups: List = []  # called at teardown, before the leak check
        self.out = os.path.join(self.tmp, "out")
        self.logs = os.path.join(self.tmp, "logs")
        self.home = os.path.join(self.tmp, "metaflow-home")  # no user config
        for d in (self.out, self.logs, self.home):
            os.makedirs(d, exist_ok=True)
        venv_bin = os.path.dirname(sys.executable)
        self.env = {
            TOKEN_VAR: self.token,
            "PATH": venv_bin + os.pathsep + "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.tmp,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "METAFLOW_USER": os.environ.get("METAFLOW_USER") or "dev",
            "METAFLOW_HOME": self.home,
            "METAFLOW_DATASTORE_SYSROOT_LOCAL": self.tmp,
            "MFTR_TEST_OUT": self.out,
        }
        # Each host's node forks its warm process from this worker's, in the host's own
        # namespaces (host/namespaces.py), not importing torch once a host (1.3 CPU-s each).
        warm = worker_warm(base={k: self.env[k] for k in ("PATH", "LANG")})
        if warm:
            self.env[HOST_ZYGOTE_ENV] = warm

    def leaks(self, grace: float = 5.0) -> List[int]:
        return leaks(self.token, grace)

    def kill_everything(self) -> None:
        kill_all(self.token)

    def log_path(self, name: str) -> str:
        return os.path.join(self.logs, name + ".log")

    def read_log(self, name: str) -> str:
        try:
            with open(self.log_path(name), "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def reports(self, prefix: str) -> Dict[int, object]:
        found = {}
        for name in os.listdir(self.out):
            if name.startswith(prefix) and name.endswith(".json"):
                with open(os.path.join(self.out, name)) as f:
                    found[int(name[len(prefix):-5])] = json.load(f)
        return found

    def wait_for_reports(self, prefix: str, count: int, timeout: float, procs=()) -> Dict[int, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.reports(prefix)
            if len(found) >= count:
                return found
            if procs and any(p.poll() is not None for p in procs):
                break
            time.sleep(0.2)
        raise AssertionError("%d of %d %s reports" % (len(self.reports(prefix)), count, prefix))


# ---------------------------------------------------------------- the run


class PlatformRun:
    """One run of ``flow_file`` whose parallel step ``step`` runs one node per host
    of ``network`` under ``platform`` ("kubernetes" or "batch")."""

    def __init__(
        self,
        sandbox: Sandbox,
        network: Network,
        platform: str,
        flow_file: str,
        params: Sequence[str] = (),
        step: str = "train",
        port: Optional[int] = None,
        dns_delay: float = 2.0,
        env: Optional[Dict[str, str]] = None,
    ):
        self.sandbox = sandbox
        self.network = network
        self.hosts: List[Host] = network.hosts
        self.platform = platform
        self.flow_file = flow_file
        self.params = list(params)
        self.step = step
        self.run_id = "mh%s" % uuid.uuid4().hex[:8]
        self.control_task_id = "control-%s-0" % self.run_id
        self.dns_delay = dns_delay
        self.env = dict(sandbox.env, **(env or {}))
        self.flow_name = _flow_class_name(flow_file)
        n = len(self.hosts)
        if platform == "kubernetes":
            self.contract = contracts.kubernetes(n, self.control_task_id, port, self.run_id, self.flow_name, step)
        elif platform == "batch":
            self.contract = contracts.batch(n, self.control_task_id, [h.ip for h in self.hosts])
        else:
            raise ValueError(platform)
        self.nodes = self.contract.nodes
        self.procs: Dict[int, subprocess.Popen] = {}
        self.launched_at: Dict[int, float] = {}
        self.ended_at: Dict[int, float] = {}
        self._timers: List[threading.Timer] = []
        self.control_listeners: Optional[ListenerWatch] = None
        self.dns_published_at: Optional[float] = None
        self._configure_names()
        sandbox.cleanups.append(self._quiesce)

    def _quiesce(self) -> None:
        """Stop the harness's own threads (DNS timer, listener watch); the
        processes are left to the leak check."""
        for timer in self._timers:
            timer.cancel()
        if self.control_listeners is not None:
            self.control_listeners.stop()

    # -- names -----------------------------------------------------------

    def _configure_names(self) -> None:
        for host, node in zip(self.hosts, self.nodes):
            host.hostname = node.hostname
            host.aliases = list(node.aliases)
            host.known = []
        if self.platform == "batch":
            # VPC DNS: every node's EC2 name resolves everywhere from the start.
            for host in self.hosts:
                host.learn((h.ip, h.aliases + [h.hostname]) for h in self.hosts if h is not host)
        else:
            # A pod resolves itself (kubelet writes its FQDN into its /etc/hosts);
            # other pods' FQDNs resolve once the headless service publishes them
            # (publish_dns).
            for host in self.hosts:
                host.write_hosts()

    def publish_dns(self) -> None:
        """Kubernetes: the JobSet's headless service starts resolving every pod."""
        # Cluster DNS answers pod FQDNs; a bare pod name is not in any search domain.
        for host in self.hosts:
            host.learn((h.ip, [a for a in h.aliases if "." in a]) for h in self.hosts if h is not host)
        self.dns_published_at = time.monotonic()

    # -- commands --------------------------------------------------------

    def _top(self, decospec: bool = True) -> List[str]:
        top = [
            sys.executable, SHIM, self.flow_file,
            "--quiet", "--no-pylint", "--metadata", "local", "--datastore", "local",
            "--environment", "local",
        ]
        if decospec:
            top += ["--with", self.contract.decospec]
        return top

    def _step_common(self, step: str, task_id: Optional[str], input_paths: str) -> List[str]:
        args = [
            "step", step, "--run-id", self.run_id, "--input-paths", input_paths,
            "--retry-count", "0", "--max-user-code-retries", "0",
            "--namespace", "user:%s" % self.env["METAFLOW_USER"],
        ]
        if task_id is not None:
            args += ["--task-id", task_id]
        return args

    def _run_on(self, host: Host, name: str, argv: List[str], timeout: float, env=None) -> None:
        start = time.monotonic()
        proc = host.popen(argv, dict(self.env, **(env or {})), self.sandbox.log_path(name), cwd=self.sandbox.tmp)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise AssertionError("%s did not finish in %ds:\n%s" % (name, timeout, self.sandbox.read_log(name)[-4000:]))
        if code != 0:
            raise AssertionError("%s failed (exit %d after %.1fs):\n%s"
                                 % (name, code, time.monotonic() - start, self.sandbox.read_log(name)[-6000:]))

    def prepare(self, timeout: float = 60) -> None:
        """``init`` and the ``start`` step, on host 0."""
        host = self.hosts[0]
        self._run_on(host, "init", self._top(decospec=False) + [
            "init", "--run-id", self.run_id, "--task-id", PARAMS_TASK] + self.params, timeout)
        self._run_on(host, "start", self._top() + self._step_common(
            "start", START_TASK, "%s/_parameters/%s" % (self.run_id, PARAMS_TASK)), timeout)

    def node_argv(self, index: int) -> List[str]:
        node = self.nodes[index]
        return self._top() + self._step_common(
            self.step, None, "%s/start/%s" % (self.run_id, START_TASK)) + node.step_options

    def node_log(self, index: int) -> str:
        return self.sandbox.read_log("node%d" % index)

    def launch(self, index: int) -> subprocess.Popen:
        node = self.nodes[index]
        env = dict(self.env, **node.env)
        proc = self.hosts[index].popen(self.node_argv(index), env, self.sandbox.log_path("node%d" % index),
                                       cwd=self.sandbox.tmp)
        self.procs[index] = proc
        self.launched_at[index] = time.monotonic()
        if node.is_control:
            self.control_listeners = ListenerWatch(proc.pid)
        if node.is_control and self.platform == "kubernetes":
            timer = threading.Timer(self.dns_delay, self.publish_dns)
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
        return proc

    def launch_all(self, order: Optional[Sequence[int]] = None, gap: float = 0.0) -> None:
        for k, index in enumerate(order if order is not None else range(len(self.nodes))):
            if k and gap:
                time.sleep(gap)
            self.launch(index)

    def wait(self, timeout: float) -> Dict[int, int]:
        """Exit codes of all launched nodes; fails (after killing them) on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, p in self.procs.items():
                if i not in self.ended_at and p.poll() is not None:
                    self.ended_at[i] = time.monotonic()
            if len(self.ended_at) == len(self.procs):
                return {i: p.returncode for i, p in self.procs.items()}
            time.sleep(0.1)
        self.stop()
        raise AssertionError("nodes still running after %ds:\n%s" % (timeout, self.logs_summary()))

    def stop(self) -> None:
        self._quiesce()
        for p in self.procs.values():
            if p.poll() is None:
                _kill_group(p)

    def logs_summary(self, tail: int = 6000) -> str:
        parts = []
        for i in sorted(self.procs):
            parts.append("----- node %d (host %s, %s) -----\n%s"
                         % (i, self.hosts[i].ip, self.nodes[i].task_id, self.node_log(i)[-tail:]))
        return "\n".join(parts)

    def run_nodes(self, timeout: float = 120, **launch) -> Dict[int, int]:
        self.launch_all(**launch)
        return self.wait(timeout)

    def join(self, timeout: float = 60, paths: Optional[Sequence[str]] = None) -> None:
        """The join step, with the input paths the runtime would give it: every
        task the platform started for the parallel step, or ``paths`` (the
        control's ``_control_mapper_tasks``, which ``run``'s runtime reads)."""
        paths = list(paths) if paths is not None else self.task_pathspecs()
        self._run_on(self.hosts[0], "join", self._top() + self._step_common(
            "join", JOIN_TASK, compress_list(paths)), timeout)

    def client(self, code: str) -> object:
        """Evaluate ``code`` (setting ``result``) with the Metaflow client on this
        run's datastore (tests/client_read.py); ``run`` is the run's pathspec."""
        return client_read.read(self.sandbox.tmp, code, run="%s/%s" % (self.flow_name, self.run_id))

    def complete(self, codes: Dict[int, int], join_artifacts: Sequence[str] = (),
                 end: bool = False, inputs: Optional[Sequence[str]] = None) -> Dict[str, object]:
        """After the parallel step: every node succeeded; run the join step (and
        with ``end``, the end step); return what the control task recorded as the
        step's tasks (the compute decorator's ``_control_mapper_tasks``, from
        which the runtime builds the join's inputs), the join's
        ``join_artifacts`` and, with ``end``, whether Metaflow counts the run as
        successful."""
        assert codes and all(c == 0 for c in codes.values()), "exit codes %s\n%s" % (codes, self.logs_summary())
        self._quiesce()
        self.join(paths=inputs)
        if end:
            self._run_on(self.hosts[0], "end", self._top() + self._step_common(
                "end", END_TASK, "%s/join/%s" % (self.run_id, JOIN_TASK)), 60)
        return self.client(
            "result = {'mapper_tasks': Task(run + '/%s/%s')['_control_mapper_tasks'].data,\n"
            "          'join': {n: Task(run + '/join/%s')[n].data for n in %r},\n"
            "          'successful': Run(run).successful if %r else None}"
            % (self.step, self.contract.control_task_id, JOIN_TASK, list(join_artifacts), end)
        )

    def mapper_tasks(self) -> List[str]:
        """The step's tasks as the control task listed them for the join (``_control_mapper_tasks``)."""
        return list(self.client("result = Task(run + '/%s/%s')['_control_mapper_tasks'].data"
                                % (self.step, self.contract.control_task_id)))

    def task_pathspecs(self) -> List[str]:
        """The tasks the platform started for the parallel step."""
        return ["%s/%s/%s" % (self.run_id, self.step, n.task_id) for n in self.nodes]


def wait_for_step(sandbox: "Sandbox", run: "PlatformRun", step: int, ranks: int = 4, timeout: float = 180.0) -> None:
    """Until every one of ``ranks`` ranks has reported step ``step`` or later (``--mark-steps``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = sandbox.reports("at-rank-")
        if len(at) >= ranks and all(r["step"] >= step for r in at.values()):  # type: ignore[index]
            return
        time.sleep(0.2)
    raise AssertionError("no step %d:\n%s" % (step, run.logs_summary()))


def listening_ports(pid: int) -> set:
    """TCP ports in LISTEN state in the network namespace of process ``pid`` (as
    /proc/<pid>/net/tcp shows that process's namespace, not ours)."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":  # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except (OSError, StopIteration):
            continue
    return ports


class ListenerWatch:
    """Samples, every 50 ms, which ports listen on a host while ``pid`` (any
    process inside it) lives; ``seen`` is the union."""

    def __init__(self, pid: int):
        self.pid = pid
        self.seen: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            ports = listening_ports(self.pid)
            if not ports and not os.path.exists("/proc/%d" % self.pid):
                return
            self.seen |= ports

    def stop(self) -> set:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.seen


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _flow_class_name(flow_file: str) -> str:
    import ast

    with open(flow_file) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
            getattr(b, "id", None) == "FlowSpec" for b in node.bases
        ):
            return node.name
    raise ValueError("no FlowSpec in %s" % flow_file)
