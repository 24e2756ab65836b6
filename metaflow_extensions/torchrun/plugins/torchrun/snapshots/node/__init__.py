"""The node's side of the snapshots: the store a call keeps open on each node, in the task (the map:
``snapshots/__init__.py``).

``store`` (the store), ``shelf`` (its slots and memory budget), ``peer`` (replication to the buddy and a
spare's fetch), ``pusher`` (the buddy's queue). It may import the rank's side (the wire, codec and
memory both read), ``gang``, ``procs``, ``host`` and ``base``. The runtime imports it from here.
"""

from .peer import PeerKey
from .shelf import default_budget
from .store import SnapshotStore

__all__ = ["PeerKey", "SnapshotStore", "default_budget"]
