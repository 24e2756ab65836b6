"""The running of a step's gang on this node: the step's session and each of its calls.

- the step: ``session`` (``GangSession``, its phases), ``step_run`` (the step's code inside the gang),
  ``context``, ``stop``, ``warm_start`` (the node's warm process), ``local_nodes`` and ``node_tasks``
  (a local run's other nodes), ``in_runtime`` (what Metaflow's runtime process runs of ours);
- a call: ``api`` (its one entry), ``call`` and ``call_launch`` (its phases and this node's share),
  ``supervisor`` (torchrun to the end), ``call_error``, ``node_report``, ``call_stacks``,
  ``restarts``, ``live_card``, ``preflight`` (the feature's entry), ``torchrun_args``;
- ``single_node``: metaflow-torchrun 0.2's launcher class.

It may import every room below it (card, record, launch, gang, cause, errors, procs, host, base).
Nothing is re-exported here: ``import metaflow`` exports 0.2's launcher class (``compat.py``) and
so passes through this package; each module is imported by its path.
"""
