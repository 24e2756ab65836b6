"""summary.md and the plot, from the JSON files a run of benchmarks/run.py left.

    python benchmarks/report.py [results dir] [plot path]
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _lib import DOCS, RESULTS  # noqa: E402


def _load(out_dir: str, name: str) -> Optional[dict]:
    path = os.path.join(out_dir, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _load_all(out_dir: str):
    """meta (a dict, maybe empty), then floor, overhead, logs, scaling, failure
    (None for a section the run did not measure)."""
    meta = _load(out_dir, "meta.json") or {}
    names = ("floor", "overhead", "logs", "scaling", "failure_latency")
    return (meta,) + tuple(_load(out_dir, n + ".json") for n in names)


def _s(v: Optional[float], digits: int = 2) -> str:
    return "-" if v is None else "%.*f s" % (digits, v)


def _r(v: Optional[float]) -> str:
    return "-" if v is None else "%.3f" % v


def _met(value: Optional[float], goal: float) -> str:
    if value is None:
        return "no result"
    return "yes" if value <= goal else "**no**"


def _npairs(section: dict, metric: str = "wall_s") -> int:
    return sum(1 for p in section.get("pairs", []) if p.get(metric, {}).get("ratio") is not None)


def write_summary(out_dir: str = RESULTS) -> str:
    meta, floor, overhead, logs, scaling, failure = _load_all(out_dir)
    m = meta.get("machine", {})
    v = meta.get("versions", {})
    args = meta.get("args", {})
    lines: List[str] = ["# @torchrun benchmarks", ""]
    lines += [
        "- machine: %s cores, %s, %s GB memory, Linux %s (load average at start: %s)" % (
            m.get("nproc", "?"), m.get("cpu_model", "?"), m.get("mem_gb", "?"), m.get("kernel", "?"),
            ", ".join("%.2f" % x for x in m.get("loadavg_at_start") or []) or "?"),
        "- date: %s" % meta.get("date", "?"),
        "- versions: Python %s, torch %s, metaflow %s, extension %s" % (
            v.get("python", "?"), v.get("torch", "?"), v.get("metaflow", "?"), v.get("extension_commit", "?")),
        "- command: `python benchmarks/run.py%s` (%s pair(s) A/B, A = `@torchrun`, B = the same job "
        "launched by hand with `python -m torch.distributed.run`; ratio = A/B per pair, median over pairs); "
        "took %s" % (
            " --quick" if args.get("quick") else "", args.get("pairs", "?"),
            "%.0f min" % (meta["duration_s"] / 60) if meta.get("duration_s") else "?"),
        "",
    ]
    if args.get("quick"):
        lines += ["**Quick run (smoke test): too few pairs and small sizes; not a measurement.**", ""]

    rows = ["| measurement | @torchrun | by hand | ratio | goal | met |", "|---|---|---|---|---|---|"]
    if overhead:
        w = overhead["wall_s"]
        rows.append("| overhead: trivial job (init, barrier, exit), 2 nodes x 2 processes, `flow.py run` wall time "
                    "| %s | %s | %s (%d pair(s)) | ratio <= %.2f | %s |" % (
                        _s(w["median_a"]), _s(w["median_b"]), _r(w["median_ratio"]), _npairs(overhead),
                        overhead["goal_ratio"], _met(w["median_ratio"], overhead["goal_ratio"])))
    if logs:
        w = logs["wall_s"]
        rows.append("| log throughput: %d ranks x %d lines, wall time | %s | %s | %s (%d pair(s)) | ratio <= %.2f | %s |" % (
            logs["ranks"], logs["lines_per_rank"], _s(w["median_a"]), _s(w["median_b"]),
            _r(w["median_ratio"]), _npairs(logs), logs["goal_ratio"], _met(w["median_ratio"], logs["goal_ratio"])))
        present = logs.get("all_lines_present", {})
        checks = logs.get("checks", {})

        def lp(variant):
            c = checks.get(variant, [])
            if not c:
                return "-"
            ok = sum(1 for x in c if x.get("complete"))
            worst = min((sum(x.get("present", {}).values()) for x in c), default=0)
            total = logs["ranks"] * logs["lines_per_rank"]
            return "%d of %d runs complete (fewest: %d of %d lines)" % (ok, len(c), worst, total)

        rows.append("| log lines present in the task logs (every rank, every line, intact) | %s | %s | | all | %s |" % (
            lp("torchrun"), lp("manual"), "yes" if present.get("torchrun") else "**no**"))
        lc = logs.get("launcher_cpu_s", {})
        rows.append("| log throughput: CPU of the launcher's processes (see below) | %s | %s | %s | | |" % (
            _s(lc.get("median_a")), _s(lc.get("median_b")), _r(lc.get("median_ratio"))))
    if failure:
        hb = failure["heartbeat_timeout_s"]
        cap = failure["cap_s"]
        names = {"rank_crash": "a rank raises: crash to every process of the gang gone",
                 "node_killed": "a node's task is SIGKILLed: kill to every process of the gang gone",
                 "node_frozen": "a node is frozen (SIGSTOP): freeze to every other node's processes gone "
                                "(heartbeat_timeout=%g s)" % hb}
        for kind in ("rank_crash", "node_killed", "node_frozen"):
            t = (failure.get("torchrun") or {}).get(kind)
            if not t:
                continue
            b = (failure.get("manual") or {}).get(kind)

            def fig(x):
                if x is None:
                    return "not measured (nothing stops torchrun when its task dies: the gang runs on)"
                n = len(x["samples_s"])
                if x["median_s"] is None:
                    return "> %g s (cap; never finished, %d run%s)" % (cap, n, "s" if n > 1 else "")
                text = "median %s, worst %s (%d runs)" % (_s(x["median_s"], 1), _s(x["max_s"], 1), n)
                if x["capped"]:
                    text += ", %d > %g s (cap)" % (x["capped"], cap)
                return text

            goal = t.get("goal_s", hb + 5 if kind == "node_frozen" else 5.0)
            med = t["median_s"] if t["capped"] * 2 < len(t["samples_s"]) else None
            rows.append("| failure: %s | %s | %s | | <= %g s | %s |" % (
                names[kind], fig(t), fig(b), goal, _met(med, goal)))
    if len(rows) > 2:
        lines += ["## Against the goals", "", "Every goal is judged on the median.", ""] + rows + [""]

    if scaling and scaling.get("configs"):
        lines += [
            "## Scaling (trivial job)",
            "",
            "Medians over pairs. *first line*: from starting `flow.py run` to the first line of the "
            "last rank (printed right after `init_process_group`). *launcher*: the processes that "
            "launch and watch the ranks, not the ranks: the train step's Metaflow tasks and the "
            "processes they start (`card create`), the torchrun agents and (`@torchrun`) each "
            "rank's output relay; CPU = user + system time, "
            "RSS = sum of each process's peak (VmHWM; shared pages counted in each).",
            "",
            "| nodes x processes | wall @torchrun | wall by hand | ratio | first line @torchrun | first line by hand "
            "| launcher CPU @torchrun | launcher CPU by hand | launcher peak RSS @torchrun | by hand |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in scaling["configs"]:
            w, f, cpu, rss = c["wall_s"], c["first_line_s"], c["launcher_cpu_s"], c["launcher_rss_mb"]
            mb = lambda x: "-" if x is None else "%.0f MB" % x  # noqa: E731
            lines.append("| %d x %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                c["nodes"], c["nproc_per_node"], _s(w["median_a"]), _s(w["median_b"]), _r(w["median_ratio"]),
                _s(f["median_a"]), _s(f["median_b"]), _s(cpu["median_a"]), _s(cpu["median_b"]),
                mb(rss["median_a"]), mb(rss["median_b"])))
        lines.append("")

    if overhead and overhead.get("phases"):
        lines += _phases_table("Where the time goes: trivial job, 2 x 2 (medians)", overhead["phases"])
    if logs and logs.get("phases"):
        lines += _phases_table("Where the time goes: log throughput (medians)", logs["phases"])
    if scaling and scaling.get("configs"):
        lines += _usage_table(scaling["configs"])
    if logs and logs.get("usage"):
        lines += _usage_table([dict(logs, nodes="%d ranks x %d lines" % (logs["ranks"], logs["lines_per_rank"]))],
                              title="log throughput")

    if floor:
        lines += ["## Floor", "", "| what | median |", "|---|---|"]
        for key, label in (("python", "`python -c pass`"), ("import_metaflow", "`python -c \"import metaflow\"`"),
                           ("import_torch", "`python -c \"import torch, torch.distributed\"`")):
            if key in floor:
                lines.append("| %s | %s |" % (label, _s(floor[key]["median_s"])))
        e = floor.get("empty_flow")
        if e:
            lines.append("| the same flow, 2 nodes, train step without any job: by hand (`@parallel`) | %s |" % _s(e["wall_s"]["median_b"]))
            lines.append("| the same, with `@torchrun` on the step (not called) | %s (ratio %s) |" % (
                _s(e["wall_s"]["median_a"]), _r(e["wall_s"]["median_ratio"])))
        if overhead and e and "import_torch" in floor:
            lines += ["", "The trivial job by hand takes %s; Metaflow alone (the same flow, no job) takes %s. "
                      "The rest is torchrun: every agent and every rank is a Python process that imports "
                      "torch (%s alone, here on %s cores)." % (
                          _s(overhead["wall_s"]["median_b"]), _s(e["wall_s"]["median_b"]),
                          _s(floor["import_torch"]["median_s"]), m.get("nproc", "?"))]
        lines.append("")
    text = "\n".join(lines)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text)
    return text


PHASES = (
    ("before_train_s", "`flow.py run` start to the train step's start (start step included)"),
    ("train_to_ready_s", "train step start to the last rank's first line"),
    ("ready_to_train_end_s", "last rank's first line to the train step's end"),
    ("after_train_s", "train step end to the end of the run (join, end)"),
)


def _phases_table(title: str, phases: Dict[str, Dict[str, Optional[float]]]) -> List[str]:
    a, b = phases.get("torchrun") or {}, phases.get("manual") or {}
    out = ["## " + title, "", "From the runtime's own timestamps (ms) and the ranks' clocks.", "",
           "| phase | @torchrun | by hand | difference |", "|---|---|---|---|"]
    for key, label in PHASES:
        va, vb = a.get(key), b.get(key)
        diff = "%+.2f s" % (va - vb) if va is not None and vb is not None else "-"
        out.append("| %s | %s | %s | %s |" % (label, _s(va), _s(vb), diff))
    return out + [""]


USAGE_KINDS = (
    ("train_task", "train step's Metaflow tasks"),
    ("train_helper", "their other children (`card create`, `git`)"),
    ("agent", "torchrun agents"),
    ("rank_helper", "per-rank helpers (@torchrun's output relay)"),
    ("rank", "ranks (the job itself, not the launcher)"),
    ("runtime", "`flow.py run` (Metaflow's runtime, reads every log line)"),
)


def _usage_table(configs: List[dict], title: str = "scaling") -> List[str]:
    out = ["## CPU and peak RSS by kind of process (%s, medians)" % title, "",
           "CPU seconds / sum of peak RSS; A = @torchrun, B = by hand.", "",
           "| config | " + " | ".join(label for _, label in USAGE_KINDS) + " |",
           "|---|" + "---|" * len(USAGE_KINDS)]
    for c in configs:
        usage = c.get("usage") or {}
        cells = []
        for kind, _ in USAGE_KINDS:
            parts = []
            for variant, tag in (("torchrun", "A"), ("manual", "B")):
                u = (usage.get(variant) or {}).get(kind)
                parts.append("%s %s" % (tag, "-" if not u else "%.1f s / %.0f MB" % (u["cpu_s"], u["rss_sum_mb"])))
            cells.append("<br>".join(parts))
        name = c["nodes"] if isinstance(c["nodes"], str) else "%d x %d" % (c["nodes"], c["nproc_per_node"])
        out.append("| %s | %s |" % (name, " | ".join(cells)))
    return out + [""]


def plot(out_dir: str = RESULTS, path: Optional[str] = None) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -r benchmarks/requirements.txt): no plot", file=sys.stderr)
        return None
    path = path or os.path.join(DOCS, "benchmarks.png")
    meta, floor, overhead, logs, scaling, failure = _load_all(out_dir)
    A, B = "#1f77b4", "#ff7f0e"
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    m = meta.get("machine", {})
    v = meta.get("versions", {})
    fig.suptitle("@torchrun (A) vs the same job launched by hand (B) - %s cores %s, torch %s, metaflow %s, %s%s" % (
        m.get("nproc", "?"), m.get("cpu_model", "?"), v.get("torch", "?"), v.get("metaflow", "?"),
        (meta.get("date") or "?")[:10], " (QUICK)" if meta.get("args", {}).get("quick") else ""), fontsize=10)

    # (1) paired wall times
    ax = axes[0][0]
    groups = []
    if floor and floor.get("empty_flow"):
        groups.append(("empty flow\n(no job)", floor["empty_flow"]["wall_s"], None))
    if overhead:
        groups.append(("trivial job\n2x2", overhead["wall_s"], overhead["goal_ratio"]))
    if logs:
        groups.append(("logs 4x%dk" % (logs["lines_per_rank"] // 1000), logs["wall_s"], logs["goal_ratio"]))
    for i, (label, w, goal) in enumerate(groups):
        for j, (key, color) in enumerate((("a", A), ("b", B))):
            med = w["median_" + key]
            if med is None:
                continue
            lo, hi = w["min_" + key], w["max_" + key]
            ax.bar(i + (j - 0.5) * 0.38, med, 0.36, color=color,
                   yerr=[[med - lo], [hi - med]], capsize=3, label=("@torchrun" if j == 0 else "by hand") if i == 0 else None)
        if w["median_a"] is not None:
            ax.text(i, max(w["max_a"] or 0, w["max_b"] or 0) * 1.02, "A/B %s%s" % (
                _r(w["median_ratio"]), "\n(goal <= %.2f)" % goal if goal else ""), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel("flow.py run wall time (s), median, min-max")
    if floor and "import_torch" in floor:
        ax.axhline(floor["import_torch"]["median_s"], color="grey", ls=":", lw=1)
        ax.text(len(groups) - 0.5, floor["import_torch"]["median_s"], " import torch", color="grey", fontsize=7, va="bottom", ha="right")
    ax.set_title("Overhead and log throughput (paired A/B)", fontsize=10)
    ax.margins(y=0.2)
    ax.legend(fontsize=8, loc="upper left")

    # (2) failure latency
    ax = axes[0][1]
    if failure:
        cap = failure["cap_s"]
        hb = failure["heartbeat_timeout_s"]
        kinds = [k for k in ("rank_crash", "node_killed", "node_frozen") if k in (failure.get("torchrun") or {})]
        for i, kind in enumerate(kinds):
            for j, (variant, color) in enumerate((("torchrun", A), ("manual", B))):
                x = (failure.get(variant) or {}).get(kind)
                pos = i + (j - 0.5) * 0.38
                if x is None:
                    ax.text(pos, 0.03, "not\nmeasured", ha="center", va="bottom", fontsize=7,
                            transform=ax.get_xaxis_transform())
                    continue
                if x["median_s"] is None:
                    ax.bar(pos, cap, 0.36, color=color, hatch="//", alpha=0.5)
                    ax.text(pos, cap, "> %gs\n(cap)" % cap, ha="center", va="bottom", fontsize=7)
                else:
                    ax.bar(pos, x["median_s"], 0.36, color=color,
                           yerr=[[0], [x["max_s"] - x["median_s"]]], capsize=3)
                    ax.text(pos, x["max_s"], "%.1f" % x["median_s"], ha="center", va="bottom", fontsize=7)
            goal = hb + 5 if kind == "node_frozen" else 5.0
            ax.hlines(goal, i - 0.45, i + 0.45, colors="red", linestyles="--", lw=1)
        ax.set_yscale("log")
        from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

        ax.yaxis.set_major_locator(FixedLocator([0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(top=cap * 2)
        ax.bar([0], [0], color=A, label="@torchrun")
        ax.bar([0], [0], color=B, label="by hand")
        ax.legend(fontsize=8, loc="upper left")
        ax.set_xticks(range(len(kinds)), [k.replace("_", " ") for k in kinds])
        ax.set_ylabel("seconds until the gang is gone (median, worst)")
        ax.set_title("Failure detection (red: goal; hatched: never within the cap)", fontsize=10)

    # (3) scaling: wall time and first line
    configs = (scaling or {}).get("configs") or []
    labels = ["%dx%d" % (c["nodes"], c["nproc_per_node"]) for c in configs]
    xs = list(range(len(configs)))
    ax = axes[1][0]
    if configs:
        # Two series on one axis (more processes per node; more nodes): a line
        # joins the points of one series only.
        series = [[i for i, c in enumerate(configs) if c["nodes"] == 2],
                  [i for i, c in enumerate(configs) if c["nproc_per_node"] == 1]]
        for key, color, name in (("a", A, "@torchrun"), ("b", B, "by hand")):
            for n, idx in enumerate(s for s in series if s):
                wall = [configs[i]["wall_s"]["median_" + key] for i in idx]
                first = [configs[i]["first_line_s"]["median_" + key] for i in idx]
                ax.plot(idx, wall, "o-", color=color, label="%s: wall" % name if n == 0 else None)
                ax.plot(idx, first, "s--", color=color,
                        label="%s: first line of last rank" % name if n == 0 else None)
        ax.set_xticks(xs, labels)
        ax.set_xlabel("nodes x processes per node")
        ax.set_ylabel("seconds from `flow.py run` (median)")
        ax.set_title("Scaling, trivial job", fontsize=10)
        ax.legend(fontsize=7)
        ax.set_ylim(bottom=0)

    # (4) scaling: launcher CPU and RSS
    ax = axes[1][1]
    if configs:
        w = 0.38
        ax.bar([x - w / 2 for x in xs], [c["launcher_cpu_s"]["median_a"] or 0 for c in configs], w, color=A, label="@torchrun: CPU")
        ax.bar([x + w / 2 for x in xs], [c["launcher_cpu_s"]["median_b"] or 0 for c in configs], w, color=B, label="by hand: CPU")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("nodes x processes per node")
        ax.set_ylabel("launcher CPU seconds (bars)")
        ax2 = ax.twinx()
        ax2.plot(xs, [c["launcher_rss_mb"]["median_a"] for c in configs], "o-", color=A, label="@torchrun: peak RSS")
        ax2.plot(xs, [c["launcher_rss_mb"]["median_b"] for c in configs], "o-", color=B, label="by hand: peak RSS")
        ax2.set_ylabel("launcher peak RSS, MB (lines; sum over processes)")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
        ax.set_title("The launcher's own processes (tasks + children, agents, relays; not the ranks)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else RESULTS
    print(write_summary(out))
    print(plot(out, sys.argv[2] if len(sys.argv) > 2 else None))
