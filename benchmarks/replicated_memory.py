"""What a node holds for replicated state (``save(..., replicated=True)``, DDP's) at 1, 2 and 8 local ranks.

The node's store runs in this process (the task's role); ``--ranks`` rank processes, real ``Saver``s through
``snapshot.save``, each save the same ``--mb`` MB state ``--saves`` times. It reports, per local rank count:
the store's held bytes (every slot's capacity, ``Shelf.used``) and its ratio to one snapshot; the memory its
memfds hold (their allocated pages, ``st_blocks``: what the node's container is charged, whoever maps them); and
this process's resident memory (VmRSS) grown since before the ranks started, which counts a slot's pages only
once the store itself has read them (a load, a push, a digest to compare a sharing rank's). Replicated state
is not pushed to the buddy (every node holds its own copy), so the node's figure is the whole cost.

    .venv/bin/python benchmarks/replicated_memory.py [--mb 50] [--saves 4] [--ranks 1 2 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

RANK = """
import sys, torch
from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank import api as snapshot
torch.manual_seed(0)
state = {"w": torch.randn(int(float(sys.argv[1]) * (1 << 20)) // 4)}
for step in range(int(sys.argv[2])):
    assert snapshot.save(step, state), "not kept"
assert snapshot.flush(60)
"""


def rss() -> int:
    """This process's resident bytes (VmRSS: its own pages and the shared ones it maps)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def measure(ranks: int, mb: float, saves: int) -> Dict[str, Any]:
    from metaflow_extensions.torchrun.plugins.torchrun.procs.names import SNAPSHOT_ENV
    from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node.store import SnapshotStore

    state = int(mb * (1 << 20)) // 4 * 4
    with tempfile.TemporaryDirectory() as tmp, SnapshotStore(tmp + "/node", budget=64 << 30) as store:
        before = rss()
        env = dict(os.environ, PYTHONPATH=REPO, LOCAL_WORLD_SIZE=str(ranks), WORLD_SIZE=str(ranks),
                   **{SNAPSHOT_ENV: store.path})
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(mb), str(saves)],
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(ranks)]
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            raise SystemExit("a rank failed: %s" % codes)
        held = store.shelf.used()
        pages = sum(os.fstat(slot.fd).st_blocks * 512 for slot in store.shelf._slots())
        grown = rss() - before
    return {"local_ranks": ranks, "state_mb": round(state / (1 << 20), 1), "held_mb": round(held / (1 << 20), 1),
            "held_x_state": round(held / state, 2),
            "memfd_mb": round(pages / (1 << 20), 1), "memfd_x_state": round(pages / state, 2), "task_rss_growth_mb": round(grown / (1 << 20), 1),
            "rss_x_state": round(grown / state, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: List[Dict[str, Any]] = [measure(n, args.mb, args.saves) for n in args.ranks]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print("%(local_ranks)d local ranks: held %(held_mb)s MB (%(held_x_state)sx the state), memfds "
              "%(memfd_mb)s MB (%(memfd_x_state)sx), task RSS +"
              "%(task_rss_growth_mb)s MB (%(rss_x_state)sx)" % row)


if __name__ == "__main__":
    main()
