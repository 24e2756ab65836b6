"""Profile one benchmark run with py-spy (every process of it, ranks included)
and say where the launcher's processes spend their time.

    python benchmarks/profile_run.py [--variant torchrun] [--nodes 2] [--nproc 2]
        [--script trivial.py] [--script-args '["--lines", "100000"]'] [--rate 100]
        [--run-args '["--max-log-size", "100"]'] [--torchrun-attrs '{"card": false}']

Prints, per kind of process (see _lib.classify), the seconds py-spy saw it busy
(samples / rate; idle threads are not sampled), then the heaviest frames of the
train step's tasks: inclusive, and the innermost frame of this extension (or,
failing that, of Metaflow) in each sample. The raw samples are kept
(--raw, py-spy's collapsed format) for flamegraph.pl or speedscope.
Needs py-spy (benchmarks/requirements.txt) and permission to ptrace.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _lib import RESULTS, Sandbox, classify  # noqa: E402

PROC_RE = re.compile(r'^process (\d+):"(.*)"$')
# py-spy names files relative to their sys.path entry: "(torchrun/call.py:160)".
OURS_RE = re.compile(r"\((?:[^()]*/)?(?:metaflow_extensions/torchrun/plugins/)?torchrun/\w+\.py:\d+\)$")
METAFLOW_RE = re.compile(r"\((?:[^()]*/)?metaflow/[^()]*\)$")


def _short(frame: str) -> str:
    frame = re.sub(r"\(/[^()]*?/site-packages/", "(", frame)
    frame = re.sub(r"\(/[^()]*?/lib/python3\.\d+/", "(", frame)
    return re.sub(r"\(/[^()]*?/metaflow_extensions/torchrun/plugins/", "(", frame)


def analyse(raw: str, rate: float, top: int = 25) -> str:
    per_kind = collections.Counter()
    per_proc_kind: dict = {}
    train_rows = []
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            procs = [(i, PROC_RE.match(fr)) for i, fr in enumerate(frames)]
            procs = [(i, m) for i, m in procs if m]
            if not procs:
                continue
            # The chain of processes gives each one's parent kind.
            parent_kind = None
            for _, m in procs:
                pid, cmd = m.group(1), m.group(2).encode()
                if pid not in per_proc_kind:
                    per_proc_kind[pid] = classify(cmd, parent_kind) if cmd else "runtime"
                parent_kind = per_proc_kind[pid]
            kind = parent_kind
            count = int(n)
            per_kind[kind] += count
            if kind == "train_task":
                train_rows.append((frames[procs[-1][0] + 1 :], count))
    out = ["busy seconds seen, per kind of process (%g samples/s):" % rate]
    for kind, n in per_kind.most_common():
        procs = sum(1 for k in per_proc_kind.values() if k == kind)
        out.append("  %-13s %7.2f s  (%d processes)" % (kind, n / rate, procs))
    total = sum(n for _, n in train_rows)
    if not total:
        return "\n".join(out)
    inclusive = collections.Counter()
    innermost = collections.Counter()
    for frames, n in train_rows:
        seen = set()
        for fr in frames:
            key = _short(fr)
            if key not in seen:
                seen.add(key)
                inclusive[key] += n
        ours = [fr for fr in frames if OURS_RE.search(fr)]
        mine = ours or [fr for fr in frames if METAFLOW_RE.search(fr)] or frames[-1:]
        innermost[_short(mine[-1]) if mine else "?"] += n
    out.append("\ntrain step tasks: %.2f busy seconds; heaviest frames (inclusive):" % (total / rate))
    for key, n in inclusive.most_common(top):
        out.append("  %6.2f s %5.1f%%  %s" % (n / rate, 100.0 * n / total, key[:150]))
    out.append("\ntrain step tasks: innermost frame of the extension (else Metaflow) per sample:")
    for key, n in innermost.most_common(top):
        out.append("  %6.2f s %5.1f%%  %s" % (n / rate, 100.0 * n / total, key[:150]))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="torchrun", choices=("torchrun", "manual"))
    ap.add_argument("--script", default="trivial.py")
    ap.add_argument("--script-args", default="[]")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--torchrun-attrs", default=None, help="JSON @torchrun attributes")
    ap.add_argument("--run-args", default="[]", help='JSON list for `run`, e.g. \'["--max-log-size", "100"]\'')
    ap.add_argument("--raw", default=os.path.join(RESULTS, "profile-raw.txt"))
    ap.add_argument("--analyse-only", action="store_true", help="only analyse an existing --raw file")
    args = ap.parse_args()
    args.raw = os.path.abspath(args.raw)
    if not args.analyse_only:
        pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(pyspy):
            sys.exit("py-spy not found: pip install -r benchmarks/requirements.txt")
        with Sandbox() as box:
            params = {"script": args.script, "script_args": json.loads(args.script_args),
                      "nodes": args.nodes, "nproc": args.nproc}
            argv = box.command(args.variant, params, json.loads(args.run_args))
            if args.variant == "manual":
                from _lib import free_port

                argv += ["--port", str(free_port())]
            env = dict(box.env)
            if args.torchrun_attrs:
                env["BENCH_TORCHRUN_ATTRS"] = args.torchrun_attrs
            os.makedirs(os.path.dirname(os.path.abspath(args.raw)), exist_ok=True)
            cmd = [pyspy, "record", "--subprocesses", "--format", "raw", "-r", str(int(args.rate)),
                   "-o", args.raw, "--"] + argv
            proc = subprocess.run(cmd, cwd=box.dir, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout.decode(errors="replace")[-3000:])
    print(analyse(args.raw, args.rate, args.top))
    print("\nraw samples: %s" % args.raw)


if __name__ == "__main__":
    main()
