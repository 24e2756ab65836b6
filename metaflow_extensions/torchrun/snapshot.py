"""Keep a rank's training state in its node's memory: the short import path.

    from metaflow_extensions.torchrun.snapshot import load, save

    resumed = load()          # after init_process_group: (step, state) every rank holds, or None
    ...
    save(step, {"model": model.state_dict(), "opt": opt.state_dict()})

It imports no Metaflow and no torch at import (a rank already has torch). Under ``@torchrun`` a
restarted gang resumes from the newest step every rank saved, not from the last checkpoint;
elsewhere ``save`` keeps nothing and ``load`` returns None.
"""

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.rank.api import SnapshotTypeError, flush, load, save

__all__ = ["save", "load", "flush", "SnapshotTypeError"]
