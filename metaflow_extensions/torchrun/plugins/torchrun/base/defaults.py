"""Every default of ``@torchrun`` a user can change, in one place (docs/configuration.md
lists them): constants importing nothing, so that every layer can read them.
"""

from __future__ import annotations

# -- @torchrun(...) attributes and current.torch.run(...) keywords -------------
HEARTBEAT_TIMEOUT = 30.0  # seconds of silence after which a node counts as dead
START_TIMEOUT = 600.0  # for every node to join the gang (and to reach each call)
SHUTDOWN_GRACE = 30.0  # the ranks' time to stop on SIGTERM before SIGKILL
HANG_TIMEOUT = None  # seconds without output from any rank before the gang stops as hung
LABEL_LOGS = True
CARD = True
ARGS_AS = "ours"  # how a dict of entrypoint_args is spelled (launch/command.ARGS_STYLES)
RESTARTS = 0  # in-step restarts of a call's ranks
SPARES = 0  # hot spares: idle nodes of num_parallel that wait to take a failed node's place
# More idle nodes than this is a typo, not a reserve; the bench on the wire holds at most this many.
MAX_SPARES = 64
MIN_NODES = None  # None: a lost node with no spare left ends the attempt; M: the gang goes on with M nodes or more
REGROW = True  # a lost node that comes back rejoins; the gang grows back to its size at the next restart
SWAP_STRAGGLERS = None  # seconds a rank stays the one the others wait for before its node is swapped (None: never)
MAX_SWAP_STRAGGLERS = 7 * 24 * 3600.0
PREFLIGHT = "versions"  # the preflight's mode (gang/preflight_modes.py's)
# In-memory snapshots (snapshots/node/store.py): None, on where a restart is allowed; a number N, the
# trainers' callbacks save every N steps (else as often as SNAPSHOT_BUDGET of a step's time allows).
SNAPSHOTS = None
SNAPSHOT_BUDGET = 0.05
SNAPSHOT_MEMORY = None  # the node's store's bytes: None, SNAPSHOT_MEMORY_SHARE of the host's available memory
SNAPSHOT_MEMORY_SHARE = 0.25
MAX_SNAPSHOT_EVERY = 1_000_000

# @torchrun's attributes and their defaults, as Metaflow's decorator declares them (spec.py reads them).
ATTRIBUTES = {
    "nproc_per_node": None,
    "torchrun_args": None,
    "port": None,
    "heartbeat_timeout": HEARTBEAT_TIMEOUT,
    "start_timeout": START_TIMEOUT,
    "label_logs": LABEL_LOGS,
    "card": CARD,
    "hang_timeout": HANG_TIMEOUT,
    "shutdown_grace": SHUTDOWN_GRACE,
    "rdzv_port": None,
    "args_as": None,
    "preflight": PREFLIGHT,
    "retry_on": None,
    "restarts": RESTARTS,
    "spares": SPARES,
    "min_nodes": MIN_NODES,
    "regrow": REGROW,
    "swap_stragglers": SWAP_STRAGGLERS,
    "snapshots": SNAPSHOTS,
    "snapshot_memory": SNAPSHOT_MEMORY,
}

# -- Metaflow configuration knobs (base/knobs.py) ------------------------------------
PROGRESS_SECONDS = 15.0  # "still waiting for node N" and the progress line, this often
STRAGGLER_RATIO = 1.5  # a node this many times slower than the median ...
STRAGGLER_SECONDS = 300.0  # ... for this long in a row is named a straggler
KEEP_LOGS_HOURS = 72.0  # a run's per-rank logs stay this long after its last call on the host ...
KEEP_LOGS = 20  # ... and beyond that while among the newest this many runs ...
MAX_LOG_MB = 500  # ... and the least recently used go while all take more than this
NODE_HISTORY_CULPRIT = 2  # a host blamed in this many ...
NODE_HISTORY_APPEARANCES = 5  # ... of its last this many appearances is flagged by the preflight ...
NODE_HISTORY_RUNS = 20  # ... read from the flow's last this many runs
NODE_HISTORY_BANDWIDTH_FRACTION = 0.5  # and a host under this fraction of its own median bandwidth
# torch's Flight Recorder entries each rank keeps (torch 2.13's default; a few hundred bytes each).
FLIGHT_RECORDER_ENTRIES = 2000
