"""Draw the card's Goodput section of a real run as docs/card-goodput.png.

The card draws the ledger with Vega-Lite in the browser; this machine has no
browser for a screenshot, so the same bars (one per attempt, the parts in the
card's order and colours, from ``goodput.bar_spec``) are drawn with
matplotlib from the run's own ``torchrun_goodput`` artifact.

    METAFLOW_DATASTORE_SYSROOT_LOCAL=<dir> python benchmarks/goodput_card.py CheckpointFlow/<run>/train/<task>
"""

from __future__ import annotations

import os
import sys

from metaflow import Task, namespace

from metaflow_extensions.torchrun.plugins.torchrun.record import goodput

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


def main(pathspec: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace(None)
    ledger = goodput.Ledger.from_wire(Task(pathspec)[goodput.ARTIFACT].data)
    assert ledger is not None, "no ledger in %s" % pathspec
    spec = goodput.bar_spec(ledger)
    scale = spec["encoding"]["color"]["scale"]
    colours = dict(zip(scale["domain"], scale["range"]))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.5 * len(ledger.segments)))
    for row, segment in enumerate(reversed(ledger.segments)):
        left = 0.0
        for part in goodput.PARTS:
            width = segment.parts.get(part, 0.0)
            if width <= 0:
                continue
            label = part.replace("_", " ")
            ax.barh(row, width, left=left, color=colours[label], label=label)
            if width > ledger.wall_seconds * 0.06:
                ax.text(left + width / 2, row, "%.0f s" % width, ha="center", va="center", fontsize=8)
            left += width
    ax.set_yticks(range(len(ledger.segments)))
    ax.set_yticklabels(["attempt %d" % s.attempt for s in reversed(ledger.segments)])
    ax.set_xlabel("seconds")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.3),
              ncol=len(unique), fontsize=8, frameon=False)
    ax.set_title(ledger.summary().replace("; ", "\n"), fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "card-goodput.png"), dpi=120)
    print("docs/card-goodput.png:", ledger.summary())


if __name__ == "__main__":
    main(sys.argv[1])
