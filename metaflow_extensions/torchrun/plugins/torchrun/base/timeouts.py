"""Every fixed time of the gang and of a stop, in one table (like torch
elastic's one home for its timeouts). The times a user sets
(``heartbeat_timeout``, ``start_timeout``, ``shutdown_grace``, ``hang_timeout``)
are in ``defaults.py``; these are the ones they do not, in seconds.

docs/design.md ("Timings") lists them with what each bounds; a test keeps the
two the same. Imports nothing: every layer reads it, the ranks included.
"""

from __future__ import annotations

# -- joining -------------------------------------------------------------------------
# How long a node waits for its join at the start of its step before its code
# goes on (the join itself goes on in the background).
JOIN_WAIT = 2.0
# One connection attempt to a candidate port of the control's gang service.
CONNECT_TIMEOUT = 2.0
# A connection must say hello within this long ...
HELLO_TIMEOUT = 5.0
# ... and a stranger that has not answered its challenge within this long may lose
# its place to a newcomer.
EVICT_AGE = 1.0
# After accept() fails (EMFILE), the service waits this long before accepting again.
ACCEPT_BACKOFF = 0.5
# How often a worker looks for the gang's secret in the run's datastore.
SECRET_POLL = 0.5
# A local run's node task seen to exit before it joined is named once its stderr
# has reached its end, or this long after its exit (a descendant may hold it open).
NODE_OUTPUT_DRAIN = 1.0

# -- while it runs -------------------------------------------------------------------
# How often the service checks timeouts, silences and progress: a silent node is
# found heartbeat_timeout plus at most this after its last heartbeat.
CHECK_PERIOD = 0.25
# A node's probe of the control (gang/probing.py), once connected, waits this long
# at most for the service's challenge and answer (a round trip and two HMACs).
PROBE_WAIT = 2.0
# How often the spot notice file is looked at while a call runs (Metaflow's
# monitor polls the instance metadata every 5 s).
NOTICE_POLL = 0.5
# How often the agent's process tree is scanned: every poll for this long after
# a start or a change, then every TRACK_INTERVAL.
TRACK_EVERY_POLL_FOR = 3.0
TRACK_INTERVAL = 1.0
# A rank's progress reports leave it (its progress file is written) at most this often.
REPORT_INTERVAL = 1.0

# How often the service sums up the gang's training progress and looks for stragglers
# (past 512 nodes, once per 512 nodes a second, as heartbeats).
PROGRESS_CHECK = 1.0

# A node's progress rides one heartbeat in this many seconds, less often past 384
# nodes (GangConfig.progress_send; the control parses each: about 7 times a bare
# heartbeat's cost).
PROGRESS_SEND = 3.0
# One nvidia-smi query of the GPUs' utilisation (host/gpu_usage.py: the straggler
# signal without progress reports) may take this long; a hung one is abandoned.
GPU_QUERY_TIMEOUT = 5.0
# While the ranks report progress, the control's card is refreshed this often
# (Metaflow renders each refresh in a `card create` subprocess: about 1 s of CPU).
LIVE_CARD_EVERY = 30.0

# -- the stop, in the order it happens ----------------------------------------------
# A report that blames a peer is held this long for a better root cause.
SECONDARY_GRACE = 3.0
# A node told to stop (SIGTERM, a spot notice) waits this long for the gang's
# verdict before it stops its own ranks anyway (a round trip takes milliseconds).
VERDICT_WAIT = 1.0
# How long a node waits for its live ranks' stack dumps and Flight Recorder
# summaries before the stop (each takes milliseconds; a rank stopped or in
# uninterruptible sleep writes nothing).
COLLECT_SECONDS = 1.0
# A peer's failure (not a preemption): the ranks get this long after SIGTERM.
PEER_STOP_GRACE = 3.0
# A node other than 0, its ranks forked warm, waits this long at most for node
# 0's rendezvous store to listen before it starts its torchrun (host/network.wait_listening).
STORE_WAIT = 3.0
# Beyond a graceful stop's grace: the agent's own time to SIGKILL the ranks that
# did not stop, and to exit.
AGENT_MARGIN = 2.0
# A spot notice's grace ends this long before the termination time.
SPOT_MARGIN = AGENT_MARGIN + 3.0
# After a job's exit barrier, the agent that hosts the rendezvous store waits at
# most this long for every other agent to say it is done with the store
# (procs/departure.py). Only a bound: the last one says so right after its own barrier.
DEPART_WAIT = 30.0
# After the agent is gone: how long the output pumps drain what was written.
DRAIN_SECONDS = 3.0
# What gathering every node's stacks may add to the control's stop, its own
# collecting included (a frozen node never sends any).
STACKS_WAIT = 2.0
# How long the control waits, once its own job has ended, for the reports of
# the nodes the gang stopped: for the card and the record, never for the stop.
REPORTS_WAIT = 2.0
# preflight="full": nodes whose ranks wait inside a collective at the deadline
# report this much later than the node stuck outside one, so it is named first.
ECHO_DELAY = 2.0
# The step's code, once the gang interrupts it, has this long to stop before the
# task ends (code stuck in a C call never sees the signal).
INTERRUPT_GRACE = 10.0
# A failed gang's service stays this long for nodes that have not heard yet.
LINGER = 15.0
# Once every node's preflight is in, the control waits at most this long for the
# node history it began reading at the task's start (then checks without it).
HISTORY_WAIT = 2.0

# -- the console ---------------------------------------------------------------------
# A line of ours waits for a pause this long in the ranks' output, at most QUIET_WAIT.
QUIET = 0.05
QUIET_WAIT = 1.0
# A rank's line redrawn with carriage returns (a progress bar) shows its latest
# state as a line of its own at most this often (procs/redraw.py).
REDRAW_SECONDS = 5.0
