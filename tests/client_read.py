"""Reading a finished run with Metaflow's client, in the test's own process.

A process for each read cost about 0.6 CPU-s (``import metaflow``), some fifty
times a suite; the test worker has Metaflow imported already. What the client
finds is what a user's notebook finds in the run's folder: the local metadata
under ``<root>/.metaflow``, artifacts and logs where the metadata says, cards
from the working directory, with no namespace.
"""

from __future__ import annotations

import json
import os
from typing import Any


def read(root: str, code: str, **names: Any) -> object:
    """Run ``code``, which sets ``result``, with Metaflow's client on the datastore
    under ``root``; ``result`` comes back through JSON, as it did from a process.
    ``names`` are more globals for ``code`` (e.g. ``run``, a pathspec)."""
    from metaflow import Flow, Run, Step, Task, metadata, namespace
    from metaflow.client import core

    scope = dict(names, json=json, Flow=Flow, Run=Run, Step=Step, Task=Task, namespace=namespace)
    here, before = os.getcwd(), (core.current_metadata, core.current_namespace)
    os.chdir(root)  # Metaflow's card store finds .metaflow from the working directory, as in a user's shell
    try:
        metadata("local@" + root)
        namespace(None)
        exec(compile(code, "<client read of %s>" % root, "exec"), scope)
    finally:
        os.chdir(here)
        core.current_metadata, core.current_namespace = before  # this process's own, as they were
    return json.loads(json.dumps(scope["result"]))
