"""In-memory snapshots: a rank's training state kept in its node's memory (and a copy on a buddy
node), so a restarted gang resumes from the newest step every rank saved, not from the last
checkpoint. The whole feature lives here, in two sides; imports point down, ``node`` to ``rank``
(import-linter holds it, pyproject.toml).

- ``rank``, what runs inside a rank (no Metaflow, as ``procs``): ``rank.api`` (the user's ``save``,
  ``load``, ``flush``: the gang's agreement on a step), ``rank.saver`` (the copy of a state into a
  slot), ``rank.codec`` (a state's layout and its tensors' bytes), ``rank.memory`` (sealed memfds passed
  over a socket), ``rank.client`` (the rank's end of the node's store's socket), ``rank.wire`` (the
  frames and keys both sides read); the trainers with no code: ``rank.trainers`` (what HF's and
  Lightning's parts share), ``rank.cadence`` (how often a trainer saves), ``rank.hf``, ``rank.lightning``;
- ``node``, the node's store in the task: ``node.store`` (the store one call keeps open on each node),
  ``node.shelf`` (its slots and its memory budget), ``node.peer`` (replication to the buddy node and a
  spare's fetch, each frame MACed under the gang's secret), ``node.pusher`` (the copies queued for the
  buddy).

Three uses of the feature live with their users, where their imports put them: ``runtime/call_snapshots.py``
(the runtime's: opens a call's store on each node and closes it with the call; it uses the gang's
client), ``gang/snapshot_directory.py`` (the gang service's: tells each node its buddy's and a source's
address) and ``procs/trainer_hooks.py`` (the ranks' import hook, shared with the trainers' progress,
that ``rank.trainers`` adds its callbacks through). ``procs/bootstrap.py`` installs ``rank.trainers``
where the step keeps snapshots.

Nothing is re-exported here: every rank that keeps snapshots passes through this package, and the node's
side (its sockets, the gang's auth) has no place in a rank. The rest imports ``node`` by its face and the
rank's modules by their path (the user's short path is ``metaflow_extensions.torchrun.snapshot``).
"""

__all__ = ["node", "rank"]
