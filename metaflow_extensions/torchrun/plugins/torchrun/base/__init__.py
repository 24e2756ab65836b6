"""The bottom room: what every other room may import, importing nothing of them.

Its concern is what the whole package agrees on: ``defaults`` (every default a user can change),
``timeouts`` (every fixed time), ``knobs`` (the ``METAFLOW_TORCHRUN_*`` settings, read once),
``codec`` (the one JSON codec of the records), ``text`` (text shortened for a person) and
``version``. It imports the standard library only. Nothing is re-exported here: a rank's start
passes through this package (``procs/handoff.py``), so each module is imported by its path.
"""
