"""The node history from Python: the short import path.

    from metaflow_extensions.torchrun.history import history

    report = history("TrainFlow", last=20)   # what `python flow.py torchrun history --json` prints

Which hosts failed or straggled, how often and why, and the causes that
recurred, read through the Metaflow client in the current namespace and
metadata (``history(None)``: every flow of the namespace). docs/resume.md says
what the report holds.
"""

from metaflow_extensions.torchrun.plugins.torchrun.record.node_history import history

__all__ = ["history"]
