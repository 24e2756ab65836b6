"""This package's version: setup.py reads it from here, and Metaflow's banner
from the top-level module (``metaflow_extensions/torchrun/toplevel``)."""

__version__ = "0.3.0.dev0"
