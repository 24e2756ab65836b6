"""Every default of ``@torchrun``, in one place (docs/configuration.md lists them).

The decorator's attributes (``decorator.py``), the step's settings
(``launch/plan.StepDefaults``), the gang's (``gang/config.GangConfig``), one
node's torchrun (``launch/command.Launch``), the single-node launcher and the
Metaflow configuration knobs (``config/mfextinit_torchrun.py``) all take their
defaults from here. Like ``torch.distributed.constants``: one module of
constants, importing nothing, at the bottom of the layers, so that every layer
can read it.
"""

from __future__ import annotations

# -- @torchrun(...) attributes and current.torch.run(...) keywords -------------
# Seconds of silence after which a node counts as dead and the gang stops.
HEARTBEAT_TIMEOUT = 30.0
# Seconds for every node to join the gang (and to reach each call).
START_TIMEOUT = 600.0
# Seconds the ranks get to stop on SIGTERM before SIGKILL.
SHUTDOWN_GRACE = 30.0
# Seconds without output from any rank before the gang stops as hung; None: never.
HANG_TIMEOUT = None
LABEL_LOGS = True
CARD = True
# How a dict of entrypoint_args is spelled (launch/command.ARGS_STYLES).
ARGS_AS = "ours"

# -- Metaflow configuration knobs (procs/names.USER_KNOBS) --------------------------
# "still waiting for node N" lines while a gang forms, and the training progress
# line while it trains, every this many seconds.
PROGRESS_SECONDS = 15.0
# A node is named a straggler when it is this many times slower than the median
# node (gang/gang_progress.py) ...
STRAGGLER_RATIO = 1.5
# ... for this many seconds in a row.
STRAGGLER_SECONDS = 300.0
# Per-rank logs, per user and host (host/retention.py): a run's are kept this many
# hours after its last call on the host ...
KEEP_LOGS_HOURS = 72.0
# ... and beyond that while it is among the newest this many runs ...
KEEP_LOGS = 20
# ... and the least recently used runs go while all logs take more than this many MB.
MAX_LOG_MB = 500
# Node history (record/node_history.py): a host blamed for a failure (culprit,
# lost or frozen, the user's own exceptions excepted) in this many ...
NODE_HISTORY_CULPRIT = 2
# ... of its last this many appearances is flagged by the next preflight ...
NODE_HISTORY_APPEARANCES = 5
# ... read from the flow's last this many runs (one metadata read per run).
NODE_HISTORY_RUNS = 20
# A host whose preflight bandwidth is under this fraction of the median of its
# own past measurements is flagged too.
NODE_HISTORY_BANDWIDTH_FRACTION = 0.5
# Entries of torch's Flight Recorder each rank keeps (procs/flight.py reads it
# when a hang is stopped): torch 2.13's own default, kept on older torch too.
# A few hundred bytes each, in the rank's memory.
FLIGHT_RECORDER_ENTRIES = 2000

# In-step restarts of a call's ranks the gang coordinates (@torchrun(restarts=N)).
RESTARTS = 0
# Hot spares (@torchrun(spares=K)): nodes of num_parallel that wait, idle, to take a
# failed node's place in an in-step restart; the gang trains on the others.
SPARES = 0
# More idle nodes than this is a typo, not a reserve (each spare is a whole node,
# paid for while it waits); the bench on the wire holds at most this many (gang/bench.py).
MAX_SPARES = 64
