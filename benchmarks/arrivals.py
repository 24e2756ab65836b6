"""Who the gang waits for (procs/arrivals.py, gang/arrivals.py): what the detector costs and how soon it names a
slow rank, on this machine.

- cost: a rank's read of its Flight Recorder (``ArrivalWatch.read_once``) in a real 2-rank gloo DDP job, the
  recorder full (TORCH_FR_BUFFER_SIZE=2000, 2100 collectives before the first read): the worst case; then the
  step time of a ~50 ms DDP loop with the watch thread (one read every EVERY s) and without, runs interleaved;
  then the node's fold (``ArrivalTracker.sample``) and the control's join (``ArrivalBook.update`` + ``tally`` +
  ``verdict``) on synthetic records, at 2 nodes x 2 ranks and at 256 nodes x 8;
- name: real flows (tests/flows/gang_flow.py, scripts/ddp_slow.py, 2 nodes x 2 processes, 100 ms steps), rank 3
  25 % and 10 % slower: from rank 0's started.json to the console line's timestamp. A shadow of the control's
  verdict, replayed here from the ranks' files copied every 2 s, says what it saw if nobody is named;
- even: one even gang for ``--even-seconds`` (30 minutes): the lines that name a rank (there should be none).

    .venv/bin/python benchmarks/arrivals.py --json benchmarks/results/arrivals.json
    .venv/bin/python benchmarks/arrivals.py --parts even --json benchmarks/results/arrivals.json
"""

import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(REPO, "tests"), REPO]

from tests.integration.helpers import Gang, output, processes_with_token  # noqa: E402

from metaflow_extensions.torchrun.plugins.torchrun.gang.arrivals import (  # noqa: E402
    SENT, ArrivalBook, ArrivalTracker, NodeArrivals)
from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import EVERY  # noqa: E402
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import NODE_INDEX_ENV, WORK_DIR_ENV  # noqa: E402

MS = 1_000_000  # ns
# The console line that names who the gang waits for: one rank ("rank 3 ... is") or a node's ("ranks 2-3 ... are").
LINE = re.compile(r"^(\S+ \S+) .*@torchrun: ranks? ([\d,-]+) \(node (\d+), [^)]*\) (?:is|are) the ones? the others wait for "
                  r"at the collectives: (\d+) % of their waiting, (\d+) ms of every second; each step takes ([\d.]+)x", re.M)

# A rank of the cost runs: argv = mode (reads | on | off), out dir, steps.
RANK_SCRIPT = r'''
import json, os, sys, time
import torch
import torch.distributed as dist
from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import ArrivalWatch

mode, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
c10d = sys.modules["torch._C._distributed_c10d"]
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(64, 256)

def step(sleep):
    time.sleep(sleep)  # the step's work, as in ddp_slow.py
    opt.zero_grad()
    model(batch).sum().backward()  # DDP's all-reduce
    opt.step()

one = torch.ones(1)
for _ in range(2100):  # the recorder full: the worst case for a read
    dist.all_reduce(one)
if mode == "reads":
    import gc
    watch, took = ArrivalWatch(out, rank), []
    gen2 = gc.get_stats()[2]["collections"]
    for _ in range(steps):
        for _ in range(20):
            step(0.0)  # new collectives for each read to write
        t = time.perf_counter()
        wrote = watch.read_once(dist, c10d)
        took.append((time.perf_counter() - t) * 1000.0)
        assert wrote, "a read wrote nothing"
    full_gcs = gc.get_stats()[2]["collections"] - gen2
    from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import newest
    import pickle
    nogc = []  # the same reads with Python's collector off: what its full collections add
    gc.disable()
    for _ in range(steps):
        for _ in range(20):
            step(0.0)
        t = time.perf_counter()
        watch.read_once(dist, c10d)
        nogc.append((time.perf_counter() - t) * 1000.0)
    gc.enable()
    parts = {"dump": [], "loads": [], "newest": [], "pickle_dump": [], "pickle_loads": []}
    for _ in range(5):  # where a read's time goes; and torch's pickled dump, without stack traces, for comparison
        t0 = time.perf_counter()
        text = c10d._dump_fr_trace_json(True, False)
        t1 = time.perf_counter()
        entries = json.loads(text)["entries"]
        t2 = time.perf_counter()
        newest(entries, 0)
        t3 = time.perf_counter()
        raw = c10d._dump_fr_trace(True, False, False)
        t4 = time.perf_counter()
        pickle.loads(raw)
        t5 = time.perf_counter()
        for key, ms in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            parts[key].append(ms * 1000.0)
    result = {"read_ms": took, "entries": len(entries), "bytes": len(text), "read_ms_nogc": nogc, "full_gcs": full_gcs,
              "parts_ms": {k: sum(v) / len(v) for k, v in parts.items()}}
else:
    if mode == "on":
        ArrivalWatch(out, rank).start()
    for _ in range(20):
        step(0.045)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        step(0.045)
    result = {"step_ms": (time.perf_counter() - t) * 1000.0 / steps,
              "read": os.path.exists(os.path.join(out, "rank-%d.arrivals.json" % rank))}
with open(os.path.join(out, "result-%d.json" % rank), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
'''


def _torchrun(mode, steps):
    tmp = tempfile.mkdtemp(prefix="arrivals-bench-")
    try:
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               script, mode, tmp, str(steps)]
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
        if done.returncode:
            raise RuntimeError("torchrun failed: %s" % output(done)[-3000:])
        return [json.load(open(os.path.join(tmp, "result-%d.json" % r))) for r in range(2)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rank_cost(reads, runs, steps):
    per_rank = _torchrun("reads", reads)
    every_ms = [ms for r in per_rank for ms in r["read_ms"]]
    mean = statistics.mean(every_ms)
    out = {"reads_per_rank": reads, "entries": [r["entries"] for r in per_rank],
           "read_ms_mean": round(mean, 2), "read_ms_max": round(max(every_ms), 2),
           "read_ms_per_rank": [[round(ms, 2) for ms in r["read_ms"]] for r in per_rank],
           "dump_bytes": per_rank[0]["bytes"], "full_gcs_in_reads": [r["full_gcs"] for r in per_rank],
           "read_ms_nogc_mean": round(statistics.mean(ms for r in per_rank for ms in r["read_ms_nogc"]), 2),
           "read_ms_nogc_max": round(max(ms for r in per_rank for ms in r["read_ms_nogc"]), 2),
           "read_parts_ms": {k: round(statistics.mean(r["parts_ms"][k] for r in per_rank), 2)
                             for k in per_rank[0]["parts_ms"]},
           "share_of_time_pct": round(mean / (EVERY * 1000.0) * 100.0, 3)}
    print("read", out, flush=True)
    if not runs:
        return out
    step = {"on": [], "off": []}
    for _ in range(runs):  # interleaved, so that the machine's other load falls on both alike
        for mode in ("off", "on"):
            ranks = _torchrun(mode, steps)
            assert all(r["read"] == (mode == "on") for r in ranks), ranks
            step[mode].append(round(statistics.mean(r["step_ms"] for r in ranks), 2))
            print(mode, step[mode][-1], flush=True)
    off, on = statistics.median(step["off"]), statistics.median(step["on"])
    out.update({"steps_per_run": steps, "step_ms_off": step["off"], "step_ms_on": step["on"],
                "step_ms_off_median": off, "step_ms_on_median": on,
                "step_cost_pct": round((on - off) / off * 100.0, 2)})
    return out


# -- the node's fold and the control's join, on synthetic records ------------------------------------------


def _files(directory, ranks, first, count, step_ms, rng):
    for r in ranks:
        seqs = list(range(first, first + count))
        ns = [10 ** 18 + s * step_ms * MS + int(rng.uniform(0, 2) * MS) for s in seqs]
        with open(os.path.join(directory, "rank-%d.arrivals.json" % r), "w") as f:
            json.dump({"rank": r, "start": 0, "seq": seqs, "ns": ns}, f)


def node_cost(per_node, calls=200):
    with tempfile.TemporaryDirectory() as d:
        _files(d, range(per_node), 1, 128, 100, random.Random(1))
        tracker = ArrivalTracker(d)
        t = time.perf_counter()
        for _ in range(calls):
            assert tracker.sample(list(range(per_node)), 0) is not None
        return round((time.perf_counter() - t) * 1000.0 / calls, 3)


def _record(node, per_node, seq, rng, at_ns):
    last, who, second = [], [], []
    for k in range(SENT):
        times = sorted((int(rng.uniform(0, 2000)), i) for i in range(per_node))  # µs after the collective's start
        last.append((seq + k) * 100_000 + times[-1][0])
        who.append(node * per_node + times[-1][1])
        second.append((seq + k) * 100_000 + times[-2 if per_node > 1 else -1][0])
    return NodeArrivals(10 ** 18, at_ns, seq, per_node, tuple(last), tuple(who), tuple(second))


def control_cost(nodes, per_node, seconds=30, per_second=10, send_every=3):
    """The control's work for ``seconds`` of a gang of 100 ms steps (``per_second`` collectives a second),
    each node's record riding a heartbeat every ``send_every`` s (PROGRESS_SEND), a tally and a verdict a
    second (ProgressBook.check); records built beforehand, so only the control's own work is timed."""
    rng = random.Random(2)
    book = ArrivalBook(clock_ns=lambda: 10 ** 18)
    plan = []
    for second in range(1, seconds + 1):
        newest = second * per_second
        sending = [n for n in range(nodes) if n % send_every == second % send_every]
        plan.append([(n, _record(n, per_node, max(1, newest - SENT + 1), rng, 10 ** 18)) for n in sending])
    for n in range(nodes):  # every node reported once before the clock starts
        book.update(n, _record(n, per_node, 1, rng, 10 ** 18))
    spent = {"update": 0.0, "tally": 0.0, "verdict": 0.0}
    expected = list(range(nodes))
    for sent in plan:
        t0 = time.perf_counter()
        for n, record in sent:
            book.update(n, record)
        t1 = time.perf_counter()
        book.tally(expected)
        t2 = time.perf_counter()
        verdict = book.verdict()
        t3 = time.perf_counter()
        spent["update"] += t1 - t0
        spent["tally"] += t2 - t1
        spent["verdict"] += t3 - t2
        assert verdict is None, verdict  # an even gang
    per_s = {k: round(v * 1000.0 / seconds, 3) for k, v in spent.items()}
    per_s["total"] = round(sum(spent.values()) * 1000.0 / seconds, 3)
    per_s["collectives_tallied"] = len(book.window)
    return per_s


def side_costs():
    out = {}
    for nodes, per_node in ((2, 2), (256, 8)):
        key = "%dx%d" % (nodes, per_node)
        out[key] = {"node_sample_ms": node_cost(per_node), "control_ms_per_s": control_cost(nodes, per_node)}
        print(key, out[key], flush=True)
    return out


# -- real flows ---------------------------------------------------------------------------------------------


class Shadow(threading.Thread):
    """Copies the ranks' arrival files every 2 s and replays the control's verdict on them, so a run that
    names nobody still says what the verdict saw (node index and work dir from each rank's environment)."""

    def __init__(self, token):
        super().__init__(daemon=True)
        self.token = token
        self.stop = threading.Event()
        self.book = ArrivalBook()
        self.verdicts = []  # (time, verdict or None)
        self.where = {}  # rank -> (node, work dir)

    def _find(self):
        for pid in processes_with_token(self.token):
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if b"RANK" in env and WORK_DIR_ENV.encode() in env and b"LOCAL_RANK" in env:
                self.where[int(env[b"RANK"])] = (int(env.get(NODE_INDEX_ENV.encode(), b"0")),
                                                 env[WORK_DIR_ENV.encode()].decode())

    def run(self):
        while not self.stop.wait(2.0):
            if len(self.where) < 4:
                self._find()
            nodes = {}
            for rank, (node, workdir) in self.where.items():
                nodes.setdefault(node, (workdir, []))[1].append(rank)
            for node, (workdir, ranks) in nodes.items():
                self.book.update(node, ArrivalTracker(workdir).sample(sorted(ranks), 0))
            self.book.tally(sorted(nodes))
            self.verdicts.append((time.time(), self.book.verdict()))

    def summary(self, started):
        return dict(self._summary(started), held_10s_at_s=self._held(started, 10.0),
                    timeline="".join("." if v is None else "x" for _, v in self.verdicts))

    def _held(self, started, seconds):
        """When the verdict had named the same one at every poll for ``seconds`` (the control's SUSTAIN)."""
        since, who = None, None
        for at, v in self.verdicts:
            now = None if v is None else (getattr(v, "named", None) or getattr(v, "rank", None))
            if now is None or now != who:
                since, who = (at if now is not None else None), now
            if since is not None and at - since >= seconds:
                return round(at - started, 1)
        return None

    def _summary(self, started):
        named = [(at, v) for at, v in self.verdicts if v is not None]
        if not named:
            return {"verdicts": len(self.verdicts), "window": len(self.book.window), "named": None,
                    **self._window()}
        at, v = named[0]
        who = getattr(v, "named", None) or str(getattr(v, "rank", "?"))
        return {"verdicts": len(self.verdicts), "first_at_s": round(at - started, 1), "who": who,
                "share": v.share, "wait_ms": v.wait_ms, "ratio": v.ratio,
                "named_share_of_polls": round(len(named) / len(self.verdicts), 2)}

    def _window(self):
        """What the verdict's window holds: the last arrivals per rank, the mean wait and the ratio."""
        win = list(self.book.window)
        if len(win) < 2:
            return {}
        per_rank = {}
        for j in win:
            per_rank.setdefault(j.rank.who, []).append(j.rank.last - j.rank.ref)
        span = (win[-1].rank.last - win[0].rank.last) / 1e6 / max(1, win[-1].seq - win[0].seq)
        return {"last_at": {r: len(w) for r, w in sorted(per_rank.items())},
                "mean_lag_ms": {r: round(statistics.mean(w) / 1e6, 2) for r, w in sorted(per_rank.items())},
                "collective_ms": round(span, 1)}


def flow(seconds, slow, extra_timeout=300):
    gang = Gang(tempfile.mkdtemp(prefix="arrivals-flow-"))
    args = ["--seconds", str(seconds), "--step", "0.1"] + (["--slow", str(slow), "--slow-rank", "3"] if slow else [])
    proc = gang.start("--script", "ddp_slow.py", "--nodes", "2", "--nproc", "2", "--script-args", json.dumps(args))
    shadow = Shadow(gang.token)
    shadow.start()
    try:
        out, _ = proc.communicate(timeout=seconds + extra_timeout)
        text = out.decode(errors="replace")
        assert proc.returncode == 0, text[-4000:]
        with open(os.path.join(gang.out, "started.json")) as f:
            started = json.load(f)["at"]
        found = LINE.findall(text)
        said = [round(datetime.datetime.strptime(at, "%Y-%m-%d %H:%M:%S.%f").timestamp() - started, 1)
                for at, *_ in found]
        shadow.stop.set()
        shadow.join()
        print("named after", said, found, flush=True)
        one = {"slow_s": slow, "seconds": seconds, "named": len(found), "any_line": text.count("the others wait for at the collectives"),
               "lines": [dict(zip(("rank", "node", "share_pct", "wait_ms", "ratio"), f[1:])) for f in found],
               "named_after_s": said, "shadow": shadow.summary(started)}
        print(one, flush=True)
        return one
    finally:
        shadow.stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        gang.kill_everything()
        shutil.rmtree(gang.tmp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="cost,name", help="any of cost, reads, sides, name, even")
    p.add_argument("--json")
    p.add_argument("--reads", type=int, default=20)
    p.add_argument("--runs", type=int, default=3, help="step-time runs per mode")
    p.add_argument("--steps", type=int, default=300, help="steps of a step-time run (~50 ms each)")
    p.add_argument("--flows", type=int, default=2, help="flows per slowdown")
    p.add_argument("--even-seconds", type=int, default=1800)
    args = p.parse_args()
    results = {}
    if args.json and os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)["results"]
    parts = args.parts.split(",")
    if "cost" in parts:
        results["rank_cost"] = rank_cost(args.reads, args.runs, args.steps)
    if "reads" in parts:  # the reads alone, the step-time runs kept as they were
        results.setdefault("rank_cost", {}).update(rank_cost(args.reads, 0, args.steps))
    if "cost" in parts or "sides" in parts:
        results["node_and_control_cost"] = side_costs()
    if "name" in parts:
        results["name_1.25x"] = [flow(50, 0.025) for _ in range(args.flows)]
        results["name_1.1x"] = [flow(120, 0.01) for _ in range(args.flows)]
    if "even" in parts:
        results["even"] = flow(args.even_seconds, 0.0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "load": os.getloadavg(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
