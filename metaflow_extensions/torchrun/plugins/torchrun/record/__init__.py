"""The records a call and the step's attempt leave behind: metadata, artifacts, the card's data,
the next attempt's reading. Plain data and pure functions, built from what the runtime hands in
(``step_record.AttemptFacts``), never from a session, a process or a socket.

- a call: ``result`` (``TorchrunResult``, what ``current.torch.run`` returns), ``gang_view`` (its
  ``gang``), ``what_ran``, ``in_step_restarts``;
- the step's attempt: ``step_record`` (its record, built once as the task ends), ``attempts``
  (every attempt, and whether the next is worth running), ``evidence``, ``goodput``, ``node_roles``;
- across runs: ``node_history``.

It may import ``launch``, ``gang``, ``cause``, ``errors``, ``procs``, ``host``, ``base`` and
Metaflow's client; never the runtime (import-linter holds it). Nothing is re-exported here:
``import metaflow`` exports ``TorchrunResult`` and so passes through this package, and would
otherwise load every record; each module is imported by its path.
"""
