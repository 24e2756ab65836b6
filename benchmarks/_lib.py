"""Shared by the benchmarks: running one benchmark flow in a sandbox, watching its
processes through /proc, and describing the machine.

Nothing here imports the test suite: the benchmarks must keep working while the
tests change. Linux only (everything is read from /proc).
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import metaflow  # noqa: F401  (first: importing Metaflow loads its extensions, ours included)
from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK
from metaflow_extensions.torchrun.plugins.torchrun.launch.command import AGENT_MODULE, BOOTSTRAP_MODULE

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FLOWS = os.path.join(HERE, "flows")
SCRIPTS = os.path.join(HERE, "scripts")
RESULTS = os.path.join(HERE, "results")
DOCS = os.path.join(REPO, "docs")

# The two variants of every job: A is @torchrun, B the same job written by hand.
VARIANTS = {
    "torchrun": os.path.join(FLOWS, "torchrun_flow.py"),
    "manual": os.path.join(FLOWS, "manual_flow.py"),
}
FLOW_NAMES = {"torchrun": "BenchTorchrunFlow", "manual": "BenchManualFlow"}

# Every process a benchmark run starts inherits this variable (a fresh value per
# run): that is how its processes are found, and killed, afterwards.
TOKEN_VAR = "BENCH_TOKEN"

# In a process's command line: a torchrun agent, or a rank of a benchmark script
# (directly, or through @torchrun's bootstrap).
# torchrun's agent: by hand ``python -m torch.distributed.run``; under @torchrun
# its own runner of it. The module names are the ones the launcher starts
# (launch/command.py), never copies: a renamed module is followed here.
AGENT_MARKS = (b"torch.distributed.run", AGENT_MODULE.encode())
SCRIPT_MARK = os.path.join(HERE, "scripts").encode() + b"/"
BOOTSTRAP_MARK = BOOTSTRAP_MODULE.encode()


def is_agent(cmd: bytes) -> bool:
    return any(mark in cmd for mark in AGENT_MARKS)

CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- /proc --------------------------------------------------------------------


def read_stat(pid: int) -> Optional[Tuple[int, bytes, float, int]]:
    """(parent pid, state, CPU seconds used (user + system), start time in ticks)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2 :].split()
    cpu = (int(rest[11]) + int(rest[12])) / CLK_TCK
    return int(rest[1]), rest[0], cpu, int(rest[19])


def cmdline(pid: int) -> bytes:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ")
    except OSError:
        return b""


def peak_rss_kb(pid: int) -> Optional[int]:
    """VmHWM: the most resident memory the process ever had (kernel-tracked, so
    a peak between two samples is not missed)."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def children(pid: int) -> List[int]:
    """Children forked by ``pid``'s main thread (every launcher involved here
    forks from its main thread; a periodic full scan catches the rest)."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid), "rb") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def all_pids() -> List[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def descendants(root: int) -> List[int]:
    """Every live process below ``root`` (one full scan of /proc)."""
    kids: Dict[int, List[int]] = {}
    for pid in all_pids():
        st = read_stat(pid)
        if st is not None:
            kids.setdefault(st[0], []).append(pid)
    out, stack = [], [root]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def processes_with_token(token: str) -> List[int]:
    needle = ("%s=%s" % (TOKEN_VAR, token)).encode()
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        st = read_stat(pid)
        if st is not None and st[1] != b"Z":
            found.append(pid)
    return found


def alive(proc: Tuple[int, int]) -> bool:
    """Is this (pid, start time) still a live, non-zombie process?"""
    st = read_stat(proc[0])
    return st is not None and st[3] == proc[1] and st[1] != b"Z"


def is_gang_process(cmd: bytes) -> bool:
    """A torchrun agent, or a rank (or a helper a rank forked, like @torchrun's
    output relay) of one of the benchmark scripts."""
    return is_agent(cmd) or SCRIPT_MARK in cmd or BOOTSTRAP_MARK in cmd


# -- a run of one benchmark flow ------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on, for the hand-written variant's rendezvous.
    Below the ephemeral range, like @torchrun's own choice."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20000, 32767)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError("no free port")


@dataclass
class ProcUsage:
    kind: str
    cmd: str
    parent_kind: Optional[str] = None
    parent_cmd: Optional[bytes] = None
    cpu_s: float = 0.0
    peak_rss_kb: int = 0
    # A process caught between fork and exec still shows its parent's command
    # line: young processes are classified again until it settles.
    recheck: int = 40


@dataclass
class RunResult:
    variant: str
    params: Dict[str, object]
    returncode: Optional[int]
    wall_s: float
    started_at: float  # time.time() just before `flow.py run` was started
    run_id: Optional[str]
    console: str  # the path of what `flow.py run` printed (gone with the sandbox)
    timed_out: bool = False
    usage: Dict[str, Dict[str, float]] = field(default_factory=dict)
    ready: Dict[int, float] = field(default_factory=dict)
    console_tail: str = ""
    # (step, "start" | "end") -> time.time() of the runtime's line about it
    events: Dict[str, float] = field(default_factory=dict)

    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def ready_times(self) -> Dict[int, float]:
        """time.time() each rank printed right after init_process_group."""
        return self.ready

    def tail(self, n: int = 4000) -> str:
        return self.console_tail[-n:]

    def phases(self) -> Dict[str, Optional[float]]:
        """Where the time went, from the runtime's timestamps (ms resolution)
        and the ranks' own: up to the train task; train task start to the last
        rank's first line; from there to the train task's end; the rest."""
        e = self.events
        last_ready = max(self.ready.values()) if self.ready else None

        def span(a, b):
            return b - a if a is not None and b is not None else None

        return {
            "before_train_s": span(self.started_at, e.get("train_start")),
            "train_to_ready_s": span(e.get("train_start"), last_ready),
            "ready_to_train_end_s": span(last_ready, e.get("train_end")),
            "train_s": span(e.get("train_start"), e.get("train_end")),
            "after_train_s": span(e.get("train_end"), e.get("done")),
        }

    def read_console(self) -> None:
        """Keep what is needed from the console before the sandbox goes."""
        found: Dict[int, float] = {}
        try:
            with open(self.console, "rb") as f:
                for line in f:
                    if b"BENCHREADY" in line:
                        m = READY_RE.search(line)
                        if m:
                            found.setdefault(int(m.group(1)), float(m.group(3)))
                    elif line.endswith(b"Task is starting.\n") or line.endswith(b"Task finished successfully.\n"):
                        m = EVENT_RE.match(line)
                        if m:
                            key = "%s_%s" % (m.group(2).decode(), "start" if b"starting" in m.group(3) else "end")
                            self.events.setdefault(key, _console_time(m.group(1)))
                    elif line.endswith(b"Done!\n"):
                        m = DONE_RE.match(line)
                        if m:
                            self.events["done"] = _console_time(m.group(1))
                size = f.tell()
                f.seek(max(0, size - 6000))
                self.console_tail = f.read().decode(errors="replace")
        except OSError:
            pass
        self.ready = found


READY_RE = re.compile(rb"BENCHREADY rank=(\d+) world=(\d+) t=([0-9.]+)")
# The runtime's own lines, timed when it wrote them:
# "2026-11-22 03:02:03.747 [1795316522417176/train/2 (pid 23317)] Task is starting."
EVENT_RE = re.compile(
    rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \[[^/\]]+/(\w+)/[^ \]]+ \(pid \d+\)\] "
    rb"(Task is starting|Task finished successfully)")
DONE_RE = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) Done!")


def _console_time(text: bytes) -> float:
    import datetime

    return datetime.datetime.strptime(text.decode(), "%Y-%m-%d %H:%M:%S.%f").timestamp()


def classify(cmd: bytes, parent_kind: Optional[str]) -> str:
    """Which part of the job a process is.

    runtime: ``flow.py run`` itself; task / train_task: Metaflow task processes
    (``train_task``: the nodes of the @parallel step); train_helper: any other
    process a train task started (``card create``, ``git``); agent: torchrun;
    rank: a worker the agent started; rank_helper: a process a rank started
    (@torchrun's per-rank output relay; the benchmark scripts start none).
    """
    if is_agent(cmd):
        return "agent"
    if parent_kind == "agent":
        return "rank"
    if parent_kind in ("rank", "rank_helper"):
        return "rank_helper"
    argv = cmd.split()
    if b"step" in argv:
        i = argv.index(b"step")
        return "train_task" if argv[i + 1 : i + 2] == [b"train"] else "task"
    if parent_kind is None:
        return "runtime"
    if parent_kind in ("train_task", "train_helper"):
        return "train_helper"
    return "other"


class Sampler(threading.Thread):
    """Every ``interval`` seconds: CPU time and peak RSS of every process below
    ``root`` (and root itself), classified. New children are found through
    /proc/PID/task/PID/children, with a full /proc scan every ``scan_every``
    ticks as a safety net; a process's CPU time is the last value read (so up to
    one interval of it, before it exits, is not counted)."""

    def __init__(self, root: int, interval: float = 0.05, scan_every: int = 20):
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.scan_every = scan_every
        self.procs: Dict[Tuple[int, int], ProcUsage] = {}
        self._kind_of_pid: Dict[int, str] = {}
        self._cmd_of_pid: Dict[int, bytes] = {}
        self._halt = threading.Event()
        self.ticks = 0

    def _add(self, pid: int, parent_kind: Optional[str]) -> None:
        st = read_stat(pid)
        if st is None:
            return
        key = (pid, st[3])
        if key in self.procs:
            return
        cmd = cmdline(pid)
        if not cmd:
            return
        parent_cmd = self._cmd_of_pid.get(st[0])
        kind = self._kind(cmd, parent_kind, parent_cmd)
        self.procs[key] = ProcUsage(kind, cmd[:300].decode(errors="replace"), parent_kind, parent_cmd)
        self._kind_of_pid[pid] = kind
        self._cmd_of_pid[pid] = cmd

    @staticmethod
    def _kind(cmd: bytes, parent_kind: Optional[str], parent_cmd: Optional[bytes]) -> str:
        # A child with its parent's very command line has not exec'd yet (or
        # never will): Metaflow's and torchrun's processes always exec, so it
        # is on its way to something else ("git", a worker); if it exits first,
        # it is a "fork". A rank's forks (@torchrun's relay) do not exec.
        if parent_cmd is not None and cmd == parent_cmd and parent_kind not in ("rank", "rank_helper"):
            return "fork"
        return classify(cmd, parent_kind)

    def _tick(self) -> None:
        if not self.procs:
            self._add(self.root, None)
        if self.ticks % self.scan_every == 0:
            for pid in descendants(self.root):
                if pid not in self._kind_of_pid:
                    st = read_stat(pid)
                    if st is not None:
                        self._add(pid, self._kind_of_pid.get(st[0]))
        for (pid, start), usage in list(self.procs.items()):
            st = read_stat(pid)
            if st is None or st[3] != start or st[1] == b"Z":
                continue
            usage.cpu_s = st[2]
            if usage.recheck > 0:
                usage.recheck -= 1
                cmd = cmdline(pid)
                if cmd and cmd[:300].decode(errors="replace") != usage.cmd:
                    usage.cmd = cmd[:300].decode(errors="replace")
                    usage.kind = self._kind(cmd, usage.parent_kind, usage.parent_cmd)
                    self._kind_of_pid[pid] = usage.kind
                    self._cmd_of_pid[pid] = cmd
            hwm = peak_rss_kb(pid)
            if hwm:
                usage.peak_rss_kb = max(usage.peak_rss_kb, hwm)
            for child in children(pid):
                if child not in self._kind_of_pid:
                    self._add(child, usage.kind)
        self.ticks += 1

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._tick()
            except Exception:  # a process vanishing mid-read is normal
                pass
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def summary(self) -> Dict[str, Dict[str, float]]:
        """Per kind: process count, CPU seconds, sum and max of peak RSS (MB)."""
        out: Dict[str, Dict[str, float]] = {}
        for usage in self.procs.values():
            s = out.setdefault(usage.kind, {"count": 0, "cpu_s": 0.0, "rss_sum_mb": 0.0, "rss_max_mb": 0.0})
            s["count"] += 1
            s["cpu_s"] += usage.cpu_s
            s["rss_sum_mb"] += usage.peak_rss_kb / 1024.0
            s["rss_max_mb"] = max(s["rss_max_mb"], usage.peak_rss_kb / 1024.0)
        return out


# What counts as the launcher's own processes: everything that is neither the
# user's ranks nor identical in both variants (Metaflow's runtime and its
# start/join/end tasks are reported apart).
LAUNCHER_KINDS = ("train_task", "train_helper", "agent", "rank_helper")


def launcher_usage(usage: Dict[str, Dict[str, float]]) -> Dict[str, float]:
    cpu = sum(usage.get(k, {}).get("cpu_s", 0.0) for k in LAUNCHER_KINDS)
    rss = sum(usage.get(k, {}).get("rss_sum_mb", 0.0) for k in LAUNCHER_KINDS)
    biggest = max([usage.get(k, {}).get("rss_max_mb", 0.0) for k in LAUNCHER_KINDS] or [0.0])
    return {"cpu_s": cpu, "rss_sum_mb": rss, "rss_max_mb": biggest}


class Sandbox:
    """One run's private world: a fresh datastore, an output directory for the
    scripts' reports, and a token in the environment of every process."""

    def __init__(self, keep: bool = False):
        self._tmp = tempfile.TemporaryDirectory(prefix="mftr-bench-")
        self.dir = self._tmp.name
        self.keep = keep
        self.token = uuid.uuid4().hex
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        venv_bin = os.path.dirname(sys.executable)
        self.env = dict(os.environ)
        self.env.update(
            {
                TOKEN_VAR: self.token,
                "BENCH_OUT": self.out,
                "METAFLOW_DATASTORE_SYSROOT_LOCAL": self.dir,
                "METAFLOW_USER": self.env.get("METAFLOW_USER") or "bench",
                # Metaflow's local runtime starts the other nodes with `python`.
                "PATH": venv_bin + os.pathsep + self.env.get("PATH", ""),
            }
        )
        self.env.pop("BENCH_TORCHRUN_ATTRS", None)

    def command(self, variant: str, params: Dict[str, object], run_args: Sequence[str] = ()) -> List[str]:
        argv = [sys.executable, VARIANTS[variant], "--no-pylint", "run",
                "--run-id-file", os.path.join(self.dir, "run-id")]
        for key, value in params.items():
            argv += ["--" + key.replace("_", "-"),
                     json.dumps(value) if isinstance(value, (list, dict)) else str(value)]
        return argv + list(run_args)

    def start(self, variant: str, params: Dict[str, object], run_args: Sequence[str] = (),
              env: Optional[Dict[str, str]] = None) -> Tuple[subprocess.Popen, str, float]:
        params = dict(params)
        if variant == "manual" and not params.get("port"):
            params["port"] = free_port()
        console = os.path.join(self.dir, "console-%s.txt" % variant)
        out = open(console, "wb")
        started = time.time()
        proc = subprocess.Popen(
            self.command(variant, params, run_args),
            cwd=self.dir,
            env=dict(self.env, **(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        return proc, console, started

    def run(self, variant: str, params: Dict[str, object], run_args: Sequence[str] = (),
            timeout: float = 600, sample: bool = False,
            env: Optional[Dict[str, str]] = None) -> RunResult:
        proc, console, started = self.start(variant, params, run_args, env)
        t0 = time.perf_counter()
        sampler = Sampler(proc.pid) if sample else None
        if sampler:
            sampler.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        wall = time.perf_counter() - t0
        if sampler:
            sampler.stop()
        if timed_out:
            self.kill_everything(proc)
        result = RunResult(
            variant=variant,
            params=params,
            returncode=proc.returncode,
            wall_s=wall,
            started_at=started,
            run_id=self.run_id(),
            console=console,
            timed_out=timed_out,
            usage=sampler.summary() if sampler else {},
        )
        result.read_console()
        return result

    def run_id(self) -> Optional[str]:
        try:
            with open(os.path.join(self.dir, "run-id")) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def client(self, code: str, timeout: float = 600) -> object:
        """Run ``code`` (which sets ``result``) with the Metaflow client on this
        sandbox's datastore, in a fresh interpreter; return ``result``."""
        program = (
            "import json\nfrom metaflow import Flow, namespace\nnamespace(None)\n"
            + code + "\nprint('@@RESULT@@' + json.dumps(result))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", program], cwd=self.dir, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError("client failed: %s" % proc.stderr[-3000:])
        line = [l for l in proc.stdout.splitlines() if l.startswith("@@RESULT@@")][-1]
        return json.loads(line[len("@@RESULT@@"):])

    def kill_everything(self, proc: Optional[subprocess.Popen] = None) -> None:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for _ in range(3):
            left = processes_with_token(self.token)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.kill_everything()
        if not self.keep:
            self._tmp.cleanup()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def node_task(root: int, node_index: int) -> Optional[int]:
    """The local Metaflow task process of one node of the train step."""
    marker = (UBF_CONTROL if node_index == 0 else UBF_TASK).encode()  # Metaflow's --ubf-context
    for pid in descendants(root):
        cmd = cmdline(pid)
        if b" step train " in cmd and marker in cmd:
            if node_index == 0 or (b"--split-index %d " % node_index) in cmd + b" ":
                return pid
    return None


# -- statistics -----------------------------------------------------------------


def median(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired(
    pairs: int,
    run_a: Callable[[int], RunResult],
    run_b: Callable[[int], RunResult],
    metrics: Dict[str, Callable[[RunResult], Optional[float]]],
    log: Callable[[str], None] = print,
    label: str = "",
    extra: Optional[Callable[[RunResult], Dict[str, object]]] = None,
) -> Dict[str, object]:
    """Run A then B, ``pairs`` times (A/B/A/B...). For each metric: the value of
    each run, the ratio A/B within each pair, and the median of those ratios
    (a failed run gives its pair no ratio). ``extra`` adds facts to each run."""
    rows = []
    for i in range(pairs):
        a = run_a(i)
        b = run_b(i)
        row: Dict[str, object] = {"a_ok": a.ok(), "b_ok": b.ok()}
        for name, fn in metrics.items():
            va = fn(a) if a.ok() else None
            vb = fn(b) if b.ok() else None
            row[name] = {"a": va, "b": vb, "ratio": va / vb if va is not None and vb else None}
        if extra:
            row["a_extra"], row["b_extra"] = extra(a), extra(b)
        for r, which in ((a, "A"), (b, "B")):
            if not r.ok():
                row.setdefault("errors", []).append(
                    "%s (%s): rc=%s%s\n%s" % (which, r.variant, r.returncode,
                                              " (timed out)" if r.timed_out else "", r.tail(1500)))
        rows.append(row)
        first = next(iter(metrics))
        m = row[first]
        log("  %s pair %d/%d: torchrun %s, manual %s, ratio %s%s" % (
            label, i + 1, pairs, fmt_s(m["a"]), fmt_s(m["b"]),
            "%.3f" % m["ratio"] if m["ratio"] else "-",
            "" if a.ok() and b.ok() else "  (FAILED: %s)" % "; ".join(
                "%s rc=%s%s" % (r.variant, r.returncode, " timeout" if r.timed_out else "")
                for r in (a, b) if not r.ok())))
    out: Dict[str, object] = {"pairs": rows, "failed_pairs": sum(
        1 for r in rows if not (r["a_ok"] and r["b_ok"]))}
    for name in metrics:
        vals = [r[name] for r in rows]
        out[name] = {
            "median_ratio": median([v["ratio"] for v in vals]),
            "median_a": median([v["a"] for v in vals]),
            "median_b": median([v["b"] for v in vals]),
            "min_a": min([v["a"] for v in vals if v["a"] is not None], default=None),
            "max_a": max([v["a"] for v in vals if v["a"] is not None], default=None),
            "min_b": min([v["b"] for v in vals if v["b"] is not None], default=None),
            "max_b": max([v["b"] for v in vals if v["b"] is not None], default=None),
        }
    return out


def fmt_s(value: Optional[float]) -> str:
    return "-" if value is None else "%.2f s" % value


# -- the machine ----------------------------------------------------------------


def machine_info() -> Dict[str, object]:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor() or platform.machine(),
        "mem_gb": mem_gb,
        "kernel": platform.release(),
        "loadavg_at_start": load,
        "hostname": socket.gethostname(),
    }


def versions() -> Dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "metaflow"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:
            out[name] = "?"
    try:
        out["extension_commit"] = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip() + (" (dirty)" if subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--", "metaflow_extensions"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip() else "")
    except Exception:
        pass
    return out


def write_json(path: str, data: object) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)
