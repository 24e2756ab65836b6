"""The node's side of the snapshots: the store a call keeps open on each node, in the task (the map:
``snapshots/__init__.py``).

``store`` (the store), ``shelf`` (its slots within its memory budget), ``budget`` (that budget: the
container's memory, not the host's), ``peer`` (replication to the buddy and a
spare's fetch), ``pusher`` (the buddy's queue). It may import the rank's side (the wire, codec and
memory both read), ``gang``, ``procs``, ``host`` and ``base``. The runtime imports it from here.
"""

from .budget import Budget, share_of
from .peer import PeerKey
from .store import SnapshotStore

__all__ = ["Budget", "PeerKey", "SnapshotStore", "share_of"]
