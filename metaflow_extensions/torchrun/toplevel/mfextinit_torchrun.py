"""Top-level names this extension adds to ``metaflow`` (``from metaflow import ...``)."""

toplevel = "torchrun_toplevel"
