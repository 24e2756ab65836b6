"""What runs in the processes torchrun starts: its agent and every rank, and the warm process.

- a rank's start: ``handoff`` (the stand-in torchrun starts), ``zygote`` and ``zygote_wire`` (the
  node's warm process that forks it), ``warm_imports`` (what it learns from a rank's first step
  for a restart), ``bootstrap`` and ``entry`` (what runs before the user's
  script), ``agent`` (torchrun's agent), ``relay`` and ``redraw`` (a rank's output), ``group_keeper``
  (a warm rank's process groups held to its end);
- what a rank leaves behind, written here and read by the task: ``failures``, ``status``,
  ``rank_progress``, ``stacks``, ``flight``, ``records``, and their readings ``culprit``, ``exits``,
  ``failure_block``, ``running``;
- jobs on every rank: ``functions`` (a Python function per rank), ``collective_check``
  (the full preflight), ``trainer_hooks``; ``names`` holds every name the task and ranks share.

It may import ``host`` and ``base``, and torch inside the functions that need it; never Metaflow
(import-linter holds it). Nothing is re-exported here: every rank's start passes through this
package, and a stand-in that hands off loads no ``typing`` (tests/unit/test_stand_in.py), so each
module is imported by its path.
"""
