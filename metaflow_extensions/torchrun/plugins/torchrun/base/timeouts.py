"""Every fixed time of the gang and of a stop, in seconds, in one table (like
torch elastic's). The times a user sets are in ``defaults.py``. docs/design.md
("Timings") says what each bounds; a test keeps the two the same.
"""

from __future__ import annotations

# -- joining -------------------------------------------------------------------------
JOIN_WAIT = 2.0  # a node's join, before its step's code goes on (the join goes on behind)
CONNECT_TIMEOUT = 2.0  # one connection attempt to a candidate port of the gang service
HELLO_TIMEOUT = 5.0  # a connection must say hello within this long ...
EVICT_AGE = 1.0  # ... and a stranger silent on its challenge this long may lose its place
ACCEPT_BACKOFF = 0.5  # after accept() fails (EMFILE)
SECRET_POLL = 0.5  # a worker's looks for the gang's secret in the datastore
NODE_OUTPUT_DRAIN = 1.0  # a local node task that exited before it joined: its stderr's end, at most
NODE_RETURN_CHECK = 0.2  # a local control looks this often for a node task killed, to start it again

# -- while it runs -------------------------------------------------------------------
CHECK_PERIOD = 0.25  # the service's checks: a silent node is found heartbeat_timeout + this late
PROBE_WAIT = 2.0  # a probe of the control, once connected: its challenge and answer
NOTICE_POLL = 0.5  # the spot notice file (Metaflow's monitor polls every 5 s)
WARM_SOCKET_WAIT = 2.0  # a stand-in come before its warm process bound its socket waits this long at most
TRACK_EVERY_POLL_FOR = 3.0  # the agent's tree scanned every poll this long after a change ...
TRACK_INTERVAL = 1.0  # ... then this often
REPORT_INTERVAL = 1.0  # a rank's progress file is written at most this often
PROGRESS_CHECK = 1.0  # the gang's progress summed up, stragglers looked for (less often past 512 nodes)
PROGRESS_SEND = 3.0  # a node's progress rides one heartbeat in this many s (less often past 384 nodes)
GPU_QUERY_TIMEOUT = 5.0  # one nvidia-smi query; a hung one is abandoned
LIVE_CARD_EVERY = 30.0  # the live card's refresh (each costs about 1 s of CPU)

# -- the stop, in the order it happens ----------------------------------------------
SECONDARY_GRACE = 3.0  # a report that blames a peer waits this long for a better root cause
VERDICT_WAIT = 1.0  # a node told to stop waits this long for the gang's verdict
COLLECT_SECONDS = 1.0  # the live ranks' stack dumps and Flight Recorder summaries
PEER_STOP_GRACE = 3.0  # a peer's failure (not a preemption): the ranks' grace after SIGTERM
STORE_WAIT = 3.0  # a node's warm ranks wait this long at most for node 0's store to listen
AGENT_MARGIN = 2.0  # beyond a grace: the agent's time to SIGKILL its ranks and exit
SPOT_MARGIN = AGENT_MARGIN + 3.0  # a spot notice's grace ends this long before the termination
DEPART_WAIT = 30.0  # the store's host waits at most this long for the other agents to leave it
DRAIN_SECONDS = 3.0  # the output pumps drain after the agent is gone
STACKS_WAIT = 2.0  # gathering every node's stacks may add this to the control's stop
REPORTS_WAIT = 2.0  # the control waits for the stopped nodes' reports (for the card and record)
ECHO_DELAY = 2.0  # preflight="full": nodes waiting inside a collective report this much later
INTERRUPT_GRACE = 10.0  # the step's code, once interrupted, before the task ends
LINGER = 15.0  # a failed gang's service stays for the nodes that have not heard
HISTORY_WAIT = 2.0  # the control waits at most this long for the node history once every preflight is in

# -- the console ---------------------------------------------------------------------
QUIET = 0.05  # a line of ours waits for a pause this long in the ranks' output ...
QUIET_WAIT = 1.0  # ... at most this long
REDRAW_SECONDS = 5.0  # a rank's carriage-return line shows as a line of its own at most this often
HELD_LINE = 0.5  # a rank's line still without its newline shows as it stands after this long
