"""Shared test set-up.

Metaflow must be imported before our modules: importing Metaflow loads its
extensions, including ours, and importing ours first would be circular.
"""

import os

os.environ.setdefault("METAFLOW_USER", "tests")

import metaflow  # noqa: E402,F401
