"""The gang at scale (issue 24): the project's real gang service and N real,
authenticated gang clients (no torch, no flow), on 127.0.0.1.

The service (``GangServer``) runs alone in this process, so this process's CPU
time is the service's; the clients run in ``--workers`` spawned processes
(``_gang_nodes.py``), nodes 0..N-2 split among them, and node N-1 in a process
of its own, the one frozen in the last phase. Per gang size and run:

1. join: every client starts joining at once; the time from the last start to
   the service counting all N joined, and whether the service aborted though
   no node failed (a false abort);
2. idle: ``--idle`` seconds of heartbeats; the service's CPU (% of one core)
   and this process's resident memory;
3. verdict: one node reports a rank failure; the time until each node's client
   has the cause (p50, p99, max; every process stamps with CLOCK_MONOTONIC of
   the same host);
4. frozen: a second gang with ``--frozen-heartbeat-timeout``; node N-1's
   process is SIGSTOPped; the time until the service's cause names it.

Bytes per node are read from the kernel at the client's end (``_gang_nodes``).
Every phase is bounded; a gang that does not form within ``--join-bound`` is
recorded as such, and larger sizes are skipped (``--keep-going`` tries them).
A benchmark, not a test: nothing here asserts a timing.

    python benchmarks/gang_scale.py --nodes 64,256 [--runs 3] [--label before]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _gang_nodes import HOST, raise_nofile, tcp_counters, worker_main  # noqa: E402

import metaflow  # noqa: E402,F401  (the package expects Metaflow imported first)
from metaflow_extensions.torchrun.plugins.torchrun.gang.config import GangConfig  # noqa: E402
from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import find_free_port  # noqa: E402
from metaflow_extensions.torchrun.plugins.torchrun.gang.server import GangServer  # noqa: E402

RESULTS = os.path.join(HERE, "results", "gang_scale.json")
DEFAULT_NODES = "64,256,1024,4096"
POLL = 0.01  # how often this process looks at the service while timing it
READY_TIMEOUT = 90.0  # a spawned worker imports Metaflow and the gang client
_LIVE: List[Any] = []  # every worker process started, killed at exit whatever happens


# -- what may change in the service's rewrite: read in one place ---------------------


def joined_count(server: GangServer) -> int:
    """How many nodes the service counts as joined: its membership's ``joined_at``
    maps node -> time of its first join."""
    return len(server.handlers.members.joined_at)


def describe(cause: Any) -> str:
    kind = getattr(cause, "kind", None)
    return "%s: %s" % (getattr(kind, "value", kind), getattr(cause, "summary", cause))


def kind_of(cause: Any) -> str:
    kind = getattr(cause, "kind", None)
    return str(getattr(kind, "value", kind))


# -- worker processes ------------------------------------------------------------------


# The cores this run may use, read once: --pin narrows the process's own affinity per size.
CORES = sorted(os.sched_getaffinity(0))


class Pool:
    """``workers`` processes for nodes 0..N-2 and a solo one (the last) for node N-1."""

    def __init__(self, workers: int, pin: bool = False):
        ctx = multiprocessing.get_context("spawn")
        self.procs: List[Any] = []
        self.conns: List[Any] = []
        self.broken: set = set()
        cores = CORES
        if pin:
            # The workers inherit this affinity: every core but the first.
            os.sched_setaffinity(0, cores[1:])
        for i in range(workers + 1):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(child, os.getpid()), name="gang-scale-%d" % i, daemon=True)
            proc.start()
            _LIVE.append(proc)
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        if pin:
            # The control (the service's threads in this process) gets the first core to itself.
            os.sched_setaffinity(0, cores[:1])
        deadline = time.monotonic() + READY_TIMEOUT
        for i in range(len(self.procs)):
            if self.recv(i, deadline) is None:
                raise RuntimeError("worker %d did not start within %.0f s" % (i, READY_TIMEOUT))

    @property
    def solo(self) -> int:
        return len(self.procs) - 1

    def send(self, i: int, command: str, **args: Any) -> None:
        if i in self.broken:
            return
        try:
            self.conns[i].send((command, args))
        except (OSError, ValueError):
            self.broken.add(i)

    def recv(self, i: int, deadline: float) -> Optional[Dict[str, Any]]:
        """Worker ``i``'s reply, or None (and the worker is not asked again)."""
        if i in self.broken:
            return None
        conn = self.conns[i]
        try:
            # A worker that died says nothing: its end of the pipe stays open
            # here (spawn keeps a copy), so wait on its exit too.
            ready = conn.poll(0) or multiprocessing.connection.wait(
                [conn, self.procs[i].sentinel], max(0.0, deadline - time.monotonic()))
            if ready and conn.poll(0):
                reply = conn.recv()
                if "error" not in reply:
                    return reply
                _say("worker %d: %s" % (i, reply["error"]))
        except (EOFError, OSError):
            pass
        self.broken.add(i)
        return None

    def ask(self, indices: Sequence[int], command: str, wait: float, **args: Any) -> Dict[int, Optional[Dict]]:
        for i in indices:
            self.send(i, command, **args)
        deadline = time.monotonic() + wait
        return {i: self.recv(i, deadline) for i in indices}

    def everyone(self) -> List[int]:
        return list(range(len(self.procs)))

    def kill(self, i: Optional[int] = None) -> None:
        for j in ([i] if i is not None else self.everyone()):
            _kill(self.procs[j])
            self.broken.add(j)


def _kill(proc: Any) -> None:
    if proc.pid is not None and proc.exitcode is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)  # reaches a stopped process too
        except OSError:
            pass
        proc.join(5)


def kill_all() -> None:
    for proc in _LIVE:
        _kill(proc)
    _LIVE.clear()


def shares(n: int, workers: int) -> List[List[int]]:
    """Nodes 0..n-2 in contiguous blocks over the workers, node n-1 alone."""
    rest = list(range(n - 1))
    size = math.ceil(len(rest) / workers) if rest else 0
    blocks = [rest[i * size:(i + 1) * size] for i in range(workers)] if size else [[] for _ in range(workers)]
    return blocks + [[n - 1]]


# -- one gang ---------------------------------------------------------------------------


class Gang:
    """A real service in this process and its N clients in the pool's workers."""

    def __init__(self, pool: Pool, n: int, heartbeat_timeout: float, join_bound: float, progress: bool = False):
        self.pool, self.n, self.join_bound, self.progress = pool, n, join_bound, progress
        self.secret = os.urandom(32)
        config = GangConfig("scale-%s" % uuid.uuid4().hex[:8], n, heartbeat_timeout=heartbeat_timeout,
                            start_timeout=join_bound + 60)
        self.server = GangServer(config, HOST, [find_free_port()], secret=self.secret).start()
        self.shares = shares(n, pool.solo)

    def owner(self, node: int) -> int:
        return next(i for i, share in enumerate(self.shares) if node in share)

    def join(self) -> Dict[str, Any]:
        """Start every client at once; wait (bounded) for the service to count them all."""
        config = self.server.config
        for i, share in enumerate(self.shares):
            self.pool.send(i, "join", gang_id=config.gang_id, num_nodes=self.n,
                           heartbeat_timeout=config.heartbeat_timeout, start_timeout=config.start_timeout,
                           port=self.server.port, secret=self.secret, nodes=share, give_up_after=self.join_bound,
                           progress=self.progress)
        deadline = time.monotonic() + self.join_bound
        replies: Dict[int, Optional[Dict]] = {}
        t_all = None
        while True:
            for i in range(len(self.shares)):
                if i not in replies and (i in self.pool.broken or self.pool.conns[i].poll(0)):
                    replies[i] = self.pool.recv(i, 0)
            now = time.monotonic()
            if t_all is None and joined_count(self.server) >= self.n:
                t_all = now
            if self.server.cause is not None or now >= deadline:
                break
            if t_all is not None and len(replies) == len(self.shares):
                break
            time.sleep(POLL)
        ended = time.monotonic()
        starts = [r for i, r in replies.items() if r and self.shares[i]]
        out: Dict[str, Any] = {"formed": t_all is not None and self.server.cause is None,
                               "joined_at_end": joined_count(self.server),
                               "false_abort": describe(self.server.cause) if self.server.cause else None}
        if len(starts) < sum(1 for s in self.shares if s):
            out["formed"] = False
            out.setdefault("notes", []).append("a worker did not start its clients")
            return out
        first, last = min(r["first_start"] for r in starts), max(r["last_start"] for r in starts)
        out["threads_per_worker"] = max(r["threads"] for r in starts)
        if t_all is not None:
            out["join_s"] = round(t_all - last, 4)
            out["join_total_s"] = round(t_all - first, 4)
        if not out["formed"]:
            out["join_ended_s"] = round(ended - last, 2)  # gave up, or aborted, this long after the last start
        waited = self.pool.ask(self.pool.everyone(), "wait_joined", 15.0,
                               seconds=5.0 if out["formed"] else 0.0)
        ok = [r for r in waited.values() if r]
        out["clients_joined"] = sum(r["joined"] for r in ok)
        out["threads_per_worker"] = max([out["threads_per_worker"]] + [r["threads"] for r in ok])
        lasts = [r["last_joined"] for r in ok if r["last_joined"] is not None]
        if out["formed"] and out["clients_joined"] == self.n and lasts:
            out["clients_joined_s"] = round(max(lasts) - last, 4)
        return out

    def counters(self) -> List[List[int]]:
        """(received, sent) bytes of every client's connection to the service."""
        got = self.pool.ask(self.pool.everyone(), "counters", 30.0)
        return [c for r in got.values() if r for c in r["counters"]]

    def client_causes(self) -> Dict[int, Any]:
        got = self.pool.ask(self.pool.everyone(), "status", 30.0)
        return {n: c for r in got.values() if r for n, c in r["causes"].items()}

    def close(self) -> None:
        """Service first (its clients then see it gone), then the clients; bounded."""
        t = threading.Thread(target=self.server.close, daemon=True)
        t.start()
        t.join(20)
        alive = [i for i in self.pool.everyone() if self.pool.procs[i].exitcode is None]
        self.pool.ask(alive, "close", 20.0, seconds=10.0)


# -- phases -------------------------------------------------------------------------------


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def idle_phase(gang: Gang, seconds: float, rss_before: int) -> Dict[str, Any]:
    """Heartbeats only: the service's CPU and memory, and the bytes it sends."""
    n = gang.n
    at_join = gang.counters()
    service0 = tcp_counters(gang.server.port, local=True)
    cpu0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)  # this thread sleeps: the process's CPU is the service's
    cpu1, t1 = time.process_time(), time.monotonic()
    rss = rss_kb()
    after = gang.counters()
    service1 = tcp_counters(gang.server.port, local=True)
    window = t1 - t0
    out: Dict[str, Any] = {
        "idle_s": round(window, 3),
        "cpu_idle_pct": round(100.0 * (cpu1 - cpu0) / window, 2),
        "rss_mb": round(rss / 1024.0, 1),
        "rss_delta_mb": round((rss - rss_before) / 1024.0, 1),
        "sockets_counted": len(at_join),
    }
    if at_join:
        received = [c[0] for c in at_join]
        out["bytes_join_per_node"] = round(sum(received) / len(received))
        out["bytes_join_max_node"] = max(received)
        out["bytes_sent_join_per_node"] = round(sum(c[1] for c in at_join) / len(at_join))
    if at_join and after:
        out["bytes_idle_per_node_s"] = round(
            (sum(c[0] for c in after) - sum(c[0] for c in at_join)) / n / window, 1)
        out["bytes_sent_idle_per_node_s"] = round(
            (sum(c[1] for c in after) - sum(c[1] for c in at_join)) / n / window, 1)
    if service0 and service1:
        out["service_sent_join_total"] = sum(c[1] for c in service0)
        out["service_sent_idle_per_node_s"] = round(
            (sum(c[1] for c in service1) - sum(c[1] for c in service0)) / n / window, 1)
    if gang.server.cause is not None:
        out["false_abort"] = describe(gang.server.cause)
    return out


def progress_seen(gang: Gang) -> Dict[str, Any]:
    """What the control made of the nodes' progress: its line, the slowest node, the stragglers."""
    record = gang.server.progress_record()
    line = gang.server.handlers.training.line() or ""
    return {"progress_nodes": record.nodes_reporting, "progress_line_chars": len(line),
            "progress_slowest": (record.slowest or {}).get("node_index"),
            "progress_chart_samples": len(record.chart)}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def verdict_phase(gang: Gang, bound: float) -> Dict[str, Any]:
    """One node reports a rank failure; when did each node's client hear it?"""
    before = gang.client_causes()  # clients that already had a cause: not timed
    reporter = gang.n // 2
    got = gang.pool.ask([gang.owner(reporter)], "report", 10.0, node=reporter)[gang.owner(reporter)]
    out: Dict[str, Any] = {"verdict_reporter": reporter, "clients_with_cause_before": len(before)}
    if before:
        out["client_cause_before"] = "node %d: %s" % next((n, c[3]) for n, c in before.items())
    if not got:
        out.setdefault("notes", []).append("the failure could not be reported")
        return out
    t0 = got["t"]
    stamps = gang.pool.ask(gang.pool.everyone(), "wait_causes", bound + 10.0, seconds=bound)
    causes = {n: c for r in stamps.values() if r for n, c in r["causes"].items() if n not in before}
    latencies = [c[0] - t0 for c in causes.values()]
    out["verdict_told"] = len(causes)
    out["verdict_wrong_cause"] = sum(1 for c in causes.values() if c[1] != "failed" or c[2] != reporter)
    if latencies:
        out.update({"verdict_p50_s": round(percentile(latencies, 0.5), 4),
                    "verdict_p99_s": round(percentile(latencies, 0.99), 4),
                    "verdict_max_s": round(max(latencies), 4)})
    cause = gang.server.cause
    out["verdict_service_cause"] = describe(cause) if cause is not None else None
    return out


def frozen_phase(gang: Gang, settle: float) -> Dict[str, Any]:
    """Node N-1's process is stopped; when does the service name it?"""
    hb = gang.server.config.heartbeat_timeout
    time.sleep(settle)
    if gang.server.cause is not None:
        return {"frozen_false_abort": describe(gang.server.cause)}
    pid = gang.pool.procs[gang.pool.solo].pid
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = stopped + 2 * hb + 10.0
        while gang.server.cause is None and time.monotonic() < deadline:
            time.sleep(POLL)
        seen = time.monotonic()
    finally:
        gang.pool.kill(gang.pool.solo)
    cause = gang.server.cause
    out: Dict[str, Any] = {"frozen_node": gang.n - 1}
    if cause is None:
        out["frozen_detect_s"] = None
        out.setdefault("notes", []).append("frozen node not named within %.0f s" % (2 * hb + 10))
        return out
    out.update({"frozen_detect_s": round(seen - stopped, 3), "frozen_excess_s": round(seen - stopped - hb, 3),
                "frozen_named": getattr(cause, "node_index", None), "frozen_kind": kind_of(cause)})
    return out


# -- one size -----------------------------------------------------------------------------


def _merge(row: Dict[str, Any], part: Dict[str, Any], prefix: str = "") -> None:
    for key, value in part.items():
        if key == "notes":
            row.setdefault("notes", []).extend(value)
        else:
            row[prefix + key] = value


def measure(n: int, run: int, opts: argparse.Namespace, base: Dict[str, Any], progress: bool = False) -> Dict[str, Any]:
    row = dict(base, nodes=n, run=run + 1, workers=opts.workers, settle_s=opts.settle, progress=progress,
               heartbeat_timeout=opts.heartbeat_timeout, pinned=opts.pin,
               frozen_heartbeat_timeout=opts.frozen_heartbeat_timeout, join_bound_s=opts.join_bound,
               load_1m=round(os.getloadavg()[0], 2))
    started = time.monotonic()
    pool = Pool(min(opts.workers, max(1, n - 1)), opts.pin)
    try:
        rss_before = rss_kb()
        gang = Gang(pool, n, opts.heartbeat_timeout, opts.join_bound, progress)
        try:
            _say("%d nodes, run %d, progress %s: joining" % (n, run + 1, "on" if progress else "off"))
            _merge(row, gang.join())
            if row["formed"]:
                _say("%d nodes: joined in %.2f s; idle %g s" % (n, row.get("join_s", -1), opts.idle))
                time.sleep(opts.settle)  # the join's last broadcasts land: not counted as idle
                _merge(row, idle_phase(gang, opts.idle, rss_before))
                if progress:
                    _merge(row, progress_seen(gang))
            if row["formed"] and row.get("false_abort") is None:
                _merge(row, verdict_phase(gang, opts.verdict_bound))
        finally:
            gang.close()
        if row["formed"] and row.get("false_abort") is None and not opts.no_frozen:
            _say("%d nodes: frozen node, heartbeat_timeout %g s" % (n, opts.frozen_heartbeat_timeout))
            gang = Gang(pool, n, opts.frozen_heartbeat_timeout, opts.join_bound, progress)
            try:
                joined = gang.join()
                row["frozen_formed"] = joined["formed"]
                row["frozen_join_false_abort"] = joined["false_abort"]
                if joined["formed"]:
                    _merge(row, frozen_phase(gang, settle=min(1.0, opts.frozen_heartbeat_timeout / 2)))
            finally:
                gang.close()
    finally:
        pool.kill()
        os.sched_setaffinity(0, CORES)
    row["elapsed_s"] = round(time.monotonic() - started, 1)
    return row


def _say(text: str) -> None:
    print("gang_scale: " + text, file=sys.stderr, flush=True)


# -- output ---------------------------------------------------------------------------------


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, timeout=20).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "../metaflow_extensions")
    except (OSError, subprocess.SubprocessError):
        return "?"
    return head + ("-dirty" if dirty else "") if head else "?"


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return "{:,}".format(value) + unit
    return ("%.*f" % (digits, value) if isinstance(value, float) else str(value)) + unit


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| nodes | label | progress | join (last start -> all joined) | false abort | control CPU idle "
             "| control RSS (delta) | bytes/node, join | bytes/node/s idle | verdict p50 / p99 / max | frozen detected (hb) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("skipped"):
            join = "skipped (%s)" % r["skipped"]
        elif r.get("formed"):
            join = _fmt(r.get("join_s"), " s")
        elif r.get("false_abort"):
            join = "**aborted after %s s** (%s/%d joined)" % (
                _fmt(r.get("join_ended_s"), "", 1), r.get("joined_at_end"), r["nodes"])
        else:
            join = "**not formed in %g s** (%s/%d joined)" % (r["join_bound_s"], r.get("joined_at_end"), r["nodes"])
        verdict = "-" if r.get("verdict_p99_s") is None else "%s / %s / %s s (%d/%d told)" % (
            _fmt(r["verdict_p50_s"], "", 3), _fmt(r["verdict_p99_s"], "", 3), _fmt(r["verdict_max_s"], "", 3),
            r["verdict_told"], r["nodes"])
        frozen = "-" if r.get("frozen_detect_s") is None else "%s s (%g s), node %s" % (
            _fmt(r["frozen_detect_s"]), r["frozen_heartbeat_timeout"], r.get("frozen_named"))
        if r.get("frozen_formed") is False:
            frozen = "**gang not formed**" + (": " + r["frozen_join_false_abort"][:72]
                                              if r.get("frozen_join_false_abort") else "")
        abort = r.get("false_abort") or r.get("client_cause_before")
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["nodes"], r.get("label") or r.get("commit", ""), "on" if r.get("progress") else "off", join, ("**" + abort[:80] + "**") if abort else "no",
            _fmt(r.get("cpu_idle_pct"), " %", 1), "%s (%s) MB" % (_fmt(r.get("rss_mb")), _fmt(r.get("rss_delta_mb")))
            if r.get("rss_mb") is not None else "-",
            _fmt(r.get("bytes_join_per_node")), _fmt(r.get("bytes_idle_per_node_s"), "", 0), verdict, frozen))
    return "\n".join(lines)


def save(rows: List[Dict[str, Any]], path: str, replace: bool) -> None:
    kept: List[Dict[str, Any]] = []
    if not replace and os.path.exists(path):
        with open(path) as f:
            try:
                data = json.load(f)
            except ValueError:
                data = []
        kept = data if isinstance(data, list) else []
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(kept + rows, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


# -- command line -----------------------------------------------------------------------------


def _sizes(text: str) -> List[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("--nodes: comma-separated gang sizes, e.g. 64,256 (got %r)" % text)
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError("--nodes: every gang size must be at least 2 (got %r)" % text)
    return sizes


def _switches(text: str) -> List[bool]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in ("on", "off") for w in words):
        raise argparse.ArgumentTypeError("--progress: off, on, or off,on (got %r)" % text)
    return [w == "on" for w in words]


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("expected a positive number of seconds, got %r" % text)
    return value


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=_sizes, default=_sizes(DEFAULT_NODES), help="gang sizes (%s)" % DEFAULT_NODES)
    p.add_argument("--runs", type=int, default=1, help="runs per size (1)")
    p.add_argument("--workers", type=int, default=8, help="processes holding the clients (8)")
    p.add_argument("--join-bound", type=_positive, default=120.0, help="seconds a gang has to form (120)")
    p.add_argument("--idle", type=_positive, default=10.0, help="seconds of idle heartbeats measured (10)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds between the gang forming and the idle phase (2): join bytes are counted at its end")
    p.add_argument("--heartbeat-timeout", type=_positive, default=30.0,
                   help="the measured gang's heartbeat_timeout (30, @torchrun's default)")
    p.add_argument("--frozen-heartbeat-timeout", type=_positive, default=5.0,
                   help="heartbeat_timeout of the frozen-node gang (5)")
    p.add_argument("--verdict-bound", type=_positive, default=30.0, help="seconds to wait for every verdict (30)")
    p.add_argument("--no-frozen", action="store_true", help="skip the frozen-node phase")
    p.add_argument("--progress", type=_switches, default=_switches("off"),
                   help="progress reports in the heartbeats: off, on, or off,on (both, one after the other, per size)")
    p.add_argument("--pin", action="store_true",
                   help="the control alone on the first core, the clients on the others, as on a cluster where "
                        "they run elsewhere (2 or more cores)")
    p.add_argument("--keep-going", action="store_true", help="try larger sizes after one did not form")
    p.add_argument("--label", default="", help="a name for these rows, e.g. before / after")
    p.add_argument("--out", default=RESULTS, help="JSON file the rows are appended to (%(default)s)")
    p.add_argument("--replace", action="store_true", help="overwrite --out instead of appending")
    p.add_argument("--table", action="store_true", help="print the table of --out and exit")
    opts = p.parse_args(argv)
    if opts.runs < 1 or opts.workers < 1:
        p.error("--runs and --workers must be at least 1")
    if not 0 <= opts.settle < 3600:
        p.error("--settle: seconds, at least 0 (got %r)" % opts.settle)
    if opts.pin and len(CORES) < 2:
        p.error("--pin needs 2 or more cores; this process may use %d" % len(CORES))
    return opts


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    opts = parse(argv)
    if opts.table:
        with open(opts.out) as f:
            print(table(json.load(f)))
        return []
    nofile = raise_nofile()
    base = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": _commit(), "cores": os.cpu_count(), "label": opts.label, "nofile": nofile}
    rows: List[Dict[str, Any]] = []
    failed_at: Optional[int] = None
    try:
        for n in opts.nodes:
            for run in range(opts.runs):
                if failed_at is not None and not opts.keep_going:
                    rows.append(dict(base, nodes=n, run=run + 1, skipped="%d did not form" % failed_at))
                    continue
                for progress in opts.progress:
                    row = measure(n, run, opts, base, progress)
                    rows.append(row)
                    if not row.get("formed"):
                        failed_at = n
    finally:
        kill_all()
        if rows:
            save(rows, opts.out, opts.replace)
    print(table(rows))
    return rows


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_sigterm)
    main()
