"""The rank's side of the snapshots: what runs inside a rank (the map: ``snapshots/__init__.py``).

``api`` (save, load, flush), ``saver``, ``codec``, ``memory``, ``client``, ``wire``; the trainers' ``trainers``,
``cadence``, ``hf`` and ``lightning``. It may import ``procs``, ``host`` and ``base``, and torch inside the
functions that need it; never Metaflow, nor the node's side (import-linter holds both). Nothing is
re-exported here: a rank's start passes through this package, so each module is imported by its path.
"""

__all__: list = []
