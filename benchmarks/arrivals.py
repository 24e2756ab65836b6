"""Who the gang waits for (procs/arrivals.py, gang/arrivals.py, gang/arrival_cost.py): what the detector
costs and how soon it names a slow rank, on this machine, for three shapes of training.

- cost: a rank's read of its Flight Recorder (``ArrivalWatch.read_once``) in a real 2-rank gloo DDP job, the
  recorder full (TORCH_FR_BUFFER_SIZE=2000, 2100 collectives before the first read): the worst case; then
  the step time with the watch thread (reading as it does in a rank) and without, runs interleaved, for
  each shape: DDP of one bucket (a 256x256 layer, a ~50 ms step), DDP of 8 buckets (8 layers of 512,
  ``bucket_cap_mb`` a layer, an all-reduce a step beside) and FSDP2 (4 layers of 256, ``fully_shard``);
  then the node's fold (``ArrivalTracker.sample``) and the control's join (``ArrivalBook.update`` +
  ``verdict``) on synthetic records, at 2 nodes x 2 ranks and at 256 nodes x 8;
- name: real flows (tests/flows/gang_flow.py, scripts/slow_layers.py, 2 nodes x 2 processes, progress
  reported), rank 3 slowed at its layers' backward by 25 % and 10 % of its step, for DDP of 8 buckets and
  FSDP2: from the slow phase's start (started.json) to the console line's timestamp, and the ratio it said
  against the one the run measured (pace.json). A shadow of the control's verdict, replayed here from the
  ranks' files every 2 s, says what it saw if nobody is named;
- even: one even gang of a shape for ``--even-seconds`` (30 minutes): the lines that name a rank (there
  should be none). Not run by default: a soak for a quiet machine.

    .venv/bin/python benchmarks/arrivals.py --json benchmarks/results/arrivals.json
    .venv/bin/python benchmarks/arrivals.py --parts even --even-shape ddp --json benchmarks/results/arrivals.json
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
from metaflow_extensions.torchrun.plugins.torchrun.procs.names import NODE_INDEX_ENV, WORK_DIR_ENV  # noqa: E402

MS = 1_000_000  # ns
# The console line that names who the gang waits for: one rank ("rank 3 ... is") or a node's ("ranks 2-3 ... are").
LINE = re.compile(r"^(\S+ \S+) .*@torchrun: ranks? ([\d,-]+) \(node (\d+), [^)]*\) (?:is|are) the ones? the others wait for "
                  r"at the collectives: (\d+) % of their waiting, (\d+) ms of every second; each step takes ([\d.]+)x", re.M)
# scripts/slow_layers.py's arguments for each shape (tests/integration/test_slow_rank.py runs the same).
SHAPES = {"ddp": ["--model", "ddp"],
          "fsdp": ["--model", "fsdp", "--layers", "4", "--width", "256", "--forward", "60", "--backward", "180"]}

# A rank of the cost runs: argv = mode (reads | on | off), out dir, steps, shape (ddp1 | ddp8 | fsdp).
RANK_SCRIPT = r'''
import json, os, sys, time
import torch
import torch.distributed as dist
from metaflow_extensions.torchrun.plugins.torchrun.procs import arrivals
from metaflow_extensions.torchrun.plugins.torchrun.procs.arrivals import ArrivalWatch

mode, out, steps, shape = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
rank = dist.get_rank()
c10d = sys.modules["torch._C._distributed_c10d"]
torch.manual_seed(rank)
if shape == "ddp1":
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    batch = torch.randn(64, 256)
elif shape == "ddp8":
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]), bucket_cap_mb=0.99 * 512 * 513 * 4 / 2 ** 20)
    batch = torch.randn(16, 512)
else:
    from torch.distributed.fsdp import fully_shard
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    batch = torch.randn(16, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
done = torch.zeros(1)

def step(sleep):
    time.sleep(sleep)  # the step's work
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()
    dist.all_reduce(done)  # the step's metric

one = torch.ones(1)
for _ in range(2100):  # the recorder full: the worst case for a read
    dist.all_reduce(one)
if mode == "reads":
    import gc
    watch, took, nogc = ArrivalWatch(out, rank), [], []
    gen2 = gc.get_stats()[2]["collections"]
    for i in range(2 * steps):
        if i == steps:
            full_gcs = gc.get_stats()[2]["collections"] - gen2
            gc.disable()  # the same reads with Python's collector off: what its full collections add
        for _ in range(20):
            step(0.0)  # new collectives for each read
        t = time.perf_counter()
        watch.read_once(dist, c10d)
        (took if i < steps else nogc).append((time.perf_counter() - t) * 1000.0)
    gc.enable()
    t0 = time.perf_counter()
    text = c10d._dump_fr_trace_json(True, False)
    t1 = time.perf_counter()
    new = arrivals.new_entries(text, -1, lambda seq: True)
    t2 = time.perf_counter()
    json.loads(text)
    t3 = time.perf_counter()
    result = {"read_ms": took, "read_ms_nogc": nogc, "full_gcs": full_gcs, "entries": new[2], "bytes": len(text),
              "parts_ms": {"dump": (t1 - t0) * 1000.0, "parse_all_ours": (t2 - t1) * 1000.0,
                           "json_loads": (t3 - t2) * 1000.0}, "level": watch.level, "wait_s": watch.wait}
else:
    watch, reads = None, []
    if mode == "on":
        watch = ArrivalWatch(out, rank)
        real = watch.read_once
        def timed(*a, **k):  # each read's time, as the rank's thread spends it
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                reads.append((time.perf_counter() - t0) * 1000.0)
        watch.read_once = timed
        watch.start()
    for _ in range(20):
        step(0.045)
    dist.barrier()
    t = time.perf_counter()
    del reads[:]
    for _ in range(steps):
        step(0.045)
    elapsed = time.perf_counter() - t
    result = {"step_ms": elapsed * 1000.0 / steps, "reads_ms": reads, "reads_share_pct": sum(reads) / elapsed / 10.0,
              "read": os.path.exists(os.path.join(out, "rank-%d.arrivals.json" % rank)),
              "wait_s": watch.wait if watch else None, "level": watch.level if watch else None}
with open(os.path.join(out, "result-%d.json" % rank), "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
'''


def _torchrun(mode, steps, shape="ddp1"):
    tmp = tempfile.mkdtemp(prefix="arrivals-bench-")
    try:
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT)
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               script, mode, tmp, str(steps), shape]
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=900)
        if done.returncode:
            raise RuntimeError("torchrun failed: %s" % output(done)[-3000:])
        return [json.load(open(os.path.join(tmp, "result-%d.json" % r))) for r in range(2)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_cost(reads):
    per_rank = _torchrun("reads", reads)
    every_ms = [ms for r in per_rank for ms in r["read_ms"]]
    out = {"reads_per_rank": reads, "read_ms_mean": round(statistics.mean(every_ms), 2),
           "read_ms_max": round(max(every_ms), 2), "dump_bytes": per_rank[0]["bytes"],
           "entries": per_rank[0]["entries"], "full_gcs_in_reads": [r["full_gcs"] for r in per_rank],
           "read_ms_nogc_mean": round(statistics.mean(ms for r in per_rank for ms in r["read_ms_nogc"]), 2),
           "read_parts_ms": {k: round(statistics.mean(r["parts_ms"][k] for r in per_rank), 2)
                             for k in per_rank[0]["parts_ms"]}}
    print("read", out, flush=True)
    return out


def step_cost(shape, runs, steps):
    step = {"on": [], "off": []}
    waits, reads, shares = [], [], []
    for _ in range(runs):  # interleaved, so that the machine's other load falls on both alike
        for mode in ("off", "on"):
            ranks = _torchrun(mode, steps, shape)
            assert all(r["read"] == (mode == "on") for r in ranks), ranks
            step[mode].append(round(statistics.mean(r["step_ms"] for r in ranks), 2))
            waits += [r["wait_s"] for r in ranks if r["wait_s"]]
            reads += [ms for r in ranks for ms in r["reads_ms"]]
            shares += [r["reads_share_pct"] for r in ranks if mode == "on"]
            print(shape, mode, step[mode][-1], flush=True)
    off, on = statistics.median(step["off"]), statistics.median(step["on"])
    return {"steps_per_run": steps, "step_ms_off": step["off"], "step_ms_on": step["on"], "step_ms_off_median": off,
            "step_ms_on_median": on, "step_cost_pct": round((on - off) / off * 100.0, 2),
            "reads_every_s": round(min(waits), 2) if waits else None,
            "read_ms_median": round(statistics.median(reads), 1) if reads else None,
            "reads_share_of_time_pct": round(statistics.median(shares), 2) if shares else None}


# -- the node's fold and the control's join, on synthetic records ------------------------------------------


def _files(directory, ranks, first, count, step_ms, rng):
    for r in ranks:
        pairs = [[k, 10 ** 18 + (k - 1) * step_ms * MS + int(rng.uniform(0, 2) * MS),
                  10 ** 18 + k * step_ms * MS + int(rng.uniform(0, 2) * MS)] for k in range(first, first + count)]
        with open(os.path.join(directory, "rank-%d.arrivals.json" % r), "w") as f:
            json.dump({"rank": r, "start": 0, "clock": "host", "groups": {"0": {"size": 2 * len(ranks),
                                                                                  "pairs": pairs}}}, f)


def node_cost(per_node, calls=200):
    """A heartbeat's fold of a node's ranks' files (256 pairs each), SENT new pairs each time."""
    with tempfile.TemporaryDirectory() as d:
        rng = random.Random(1)
        spent = 0.0
        for i in range(calls):
            _files(d, range(per_node), 1 + i * SENT, 256, 100, rng)
            tracker = ArrivalTracker(d)
            t = time.perf_counter()
            assert tracker.sample(list(range(per_node)), 0) is not None
            spent += time.perf_counter() - t
        return round(spent * 1000.0 / calls, 3)


def _record(node, per_node, first, rng, nodes):
    last, who, second = [], [], []
    for k in range(first, first + SENT):
        for at in (k - 1, k):
            times = sorted((int(rng.uniform(0, 2000)), i) for i in range(per_node))  # µs after the collective
            last.append(at * 100_000 + times[-1][0])
            who.append(node * per_node + times[-1][1])
            second.append(at * 100_000 + times[-2 if per_node > 1 else -1][0])
    return NodeArrivals(10 ** 18, 10 ** 18, "host", ("0",), (nodes * per_node,), (per_node,), (0,) * SENT,
                        tuple(range(first, first + SENT)), tuple(last), tuple(who), tuple(second))


def control_cost(nodes, per_node, seconds=30, per_second=12, send_every=3):
    """The control's work for ``seconds`` of a gang whose nodes each send the ``per_second`` pairs a second
    the ranks keep, every ``send_every`` s (PROGRESS_SEND), a verdict a second (ProgressBook.check);
    records built beforehand, so only the control's own work is timed."""
    rng = random.Random(2)
    book = ArrivalBook(clock_ns=lambda: 10 ** 18)
    plan = []
    for second in range(seconds):
        sending = [n for n in range(nodes) if n % send_every == second % send_every]
        plan.append([(n, _record(n, per_node, 2 + second // send_every * per_second * send_every, rng, nodes))
                     for n in sending])
    spent = {"update": 0.0, "verdict": 0.0}
    for sent in plan:
        t0 = time.perf_counter()
        for n, record in sent:
            book.update(n, record)
        t1 = time.perf_counter()
        verdict = book.verdict()
        t2 = time.perf_counter()
        spent["update"] += t1 - t0
        spent["verdict"] += t2 - t1
        assert verdict is None, verdict  # an even gang
    per_s = {k: round(v * 1000.0 / seconds, 3) for k, v in spent.items()}
    per_s["total"] = round(sum(spent.values()) * 1000.0 / seconds, 3)
    per_s["pairs_joined"] = book.joined
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
        self.trackers = {}
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
                tracker = self.trackers.setdefault((node, workdir), ArrivalTracker(workdir))
                self.book.update(node, tracker.sample(sorted(ranks), 0))
            self.verdicts.append((time.time(), self.book.verdict()))

    def summary(self, started):
        named = [(at, v) for at, v in self.verdicts if v is not None]
        out = {"verdicts": len(self.verdicts), "pairs_joined": self.book.joined,
               "timeline": "".join("." if v is None else "x" for _, v in self.verdicts)}
        if named:
            at, v = named[0]
            out.update({"first_at_s": round(at - started, 1), "who": v.named, "share": v.share, "ratio": v.ratio,
                        "named_share_of_polls": round(len(named) / len(self.verdicts), 2)})
        return out


def flow(shape, slow, seconds, extra_timeout=300):
    gang = Gang(tempfile.mkdtemp(prefix="arrivals-flow-"))
    args = SHAPES[shape] + ["--slow", str(slow), "--slow-rank", "3", "--seconds", str(seconds)]
    proc = gang.start("--script", "slow_layers.py", "--nodes", "2", "--nproc", "2", "--script-args", json.dumps(args))
    shadow = Shadow(gang.token)
    shadow.start()
    try:
        out, _ = proc.communicate(timeout=seconds + extra_timeout)
        text = out.decode(errors="replace")
        assert proc.returncode == 0, text[-4000:]
        with open(os.path.join(gang.out, "started.json")) as f:
            slow_from = json.load(f)["at"]
        with open(os.path.join(gang.out, "pace.json")) as f:
            pace = json.load(f)
        measured = (pace["slow"]["seconds"] / pace["slow"]["steps"]) / (pace["even"]["seconds"] / pace["even"]["steps"])
        found = LINE.findall(text)
        said = [round(datetime.datetime.strptime(at, "%Y-%m-%d %H:%M:%S.%f").timestamp() - slow_from, 1)
                for at, *_ in found]
        shadow.stop.set()
        shadow.join()
        one = {"shape": shape, "slow": slow, "seconds": seconds, "named": len(found), "measured_ratio": round(measured, 3),
               "lines": [dict(zip(("rank", "node", "share_pct", "wait_ms", "ratio"), f[1:])) for f in found],
               "named_after_s": said, "shadow": shadow.summary(slow_from)}
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
    p.add_argument("--parts", default="reads,cost,sides,name", help="any of reads, cost, sides, name, even")
    p.add_argument("--json")
    p.add_argument("--reads", type=int, default=20)
    p.add_argument("--runs", type=int, default=3, help="step-time runs per mode and shape")
    p.add_argument("--steps", type=int, default=300, help="steps of a step-time run (~50 ms each)")
    p.add_argument("--shapes", default="ddp1,ddp8,fsdp")
    p.add_argument("--flows", type=int, default=1, help="flows per shape and slowdown")
    p.add_argument("--even-seconds", type=int, default=1800)
    p.add_argument("--even-shape", default="ddp", choices=sorted(SHAPES))
    args = p.parse_args()
    results = {}
    if args.json and os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)["results"]
    parts = args.parts.split(",")
    if "reads" in parts:
        results["read_cost"] = read_cost(args.reads)
    if "cost" in parts:
        for shape in args.shapes.split(","):
            results.setdefault("step_cost", {})[shape] = step_cost(shape, args.runs, args.steps)
    if "sides" in parts:
        results["node_and_control_cost"] = side_costs()
    if "name" in parts:
        for shape in SHAPES:
            for slow, seconds in ((1.25, 45), (1.1, 60)):
                results.setdefault("name", {})["%s_%.2fx" % (shape, slow)] = [
                    flow(shape, slow, seconds) for _ in range(args.flows)]
    if "even" in parts:
        results["even_%s" % args.even_shape] = flow(args.even_shape, 1.0, args.even_seconds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "load": os.getloadavg(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
