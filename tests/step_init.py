"""A flow's start, in this process: what ``python flow.py ... run`` does before
its first task (Metaflow's graph checks, then every step decorator's
``step_init``), without the subprocess, Metaflow's CLI and its datastore.

A refusal test of a flow that never reaches a task pays a subprocess that
imports Metaflow and @torchrun (about 0.5 CPU-s, a second of wall time); here it
is the flow file's import, in milliseconds. One real run per kind of refusal
stays in the integration tests, as the witness that the message reaches the
console and the run exits non-zero.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence

import metaflow  # noqa: F401  (Metaflow first: it loads our extension)
from metaflow import decorators as mf_decorators
from metaflow import lint
from metaflow.cli import logger
from metaflow.datastore import FlowDataStore
from metaflow.exception import MetaflowException
from metaflow.flowspec import FlowSpec
from metaflow.graph import FlowGraph
from metaflow.metaflow_environment import MetaflowEnvironment
from metaflow.plugins.datastores.local_storage import LocalStorage

FLOWS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flows")


@dataclass(frozen=True)
class Refusal:
    """A flow refused at its start, as Metaflow's CLI would print it: the
    exception's headline, then its message (``print_metaflow_exception``)."""

    error: MetaflowException

    @property
    def message(self) -> str:
        return self.error.message

    @property
    def text(self) -> str:
        return "%s:\n%s" % (self.error.headline, self.error.message)


@contextlib.contextmanager
def _process(env: Dict[str, str], argv: Sequence[str]) -> Iterator[None]:
    """``env`` in os.environ and ``argv`` as sys.argv, as the flow's process would
    have them, both put back afterwards (the decorator reads sys.argv to tell the
    launcher from a task and ``step-functions create`` from ``run``)."""
    saved_env, saved_argv = dict(os.environ), list(sys.argv)
    os.environ.update(env)
    sys.argv[:] = list(argv)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv


@contextlib.contextmanager
def _flow_class(path: str) -> Iterator[type]:
    """The FlowSpec subclass of the flow file, imported afresh (the test flows
    read their decorators' attributes from the environment at import), under a
    name of its own in sys.modules while it is used: the graph's parser reads
    the class's source through it."""
    name = "mftr_step_init_%s" % uuid.uuid4().hex
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        flows = [c for c in vars(module).values()
                 if inspect.isclass(c) and issubclass(c, FlowSpec) and c is not FlowSpec and c.__module__ == name]
        assert len(flows) == 1, "%s holds %d flows" % (path, len(flows))
        yield flows[0]
    finally:
        sys.modules.pop(name, None)


def start(flow: str, env: Optional[Dict[str, str]] = None,
          args: Sequence[str] = ("--no-pylint", "run")) -> Optional[Refusal]:
    """Start ``flow`` (a file of tests/flows, or a path) as ``python flow
    <args>`` would, up to its first task: None if it would go on to run, else
    the refusal. Anything but a MetaflowException propagates: Metaflow's CLI
    would print it with a traceback, which no refusal may show."""
    path = flow if os.path.isabs(flow) else os.path.join(FLOWS, flow)
    with _process(dict(env or {}), [path, *args]), tempfile.TemporaryDirectory() as root:
        try:
            with _flow_class(path) as cls:
                _start(cls, root)
        except MetaflowException as e:
            return Refusal(e)
    return None


def _start(cls: type, root: str) -> None:
    """What ``run`` does with the flow before its first task, in its order."""
    flow_obj = cls(use_cli=False)
    graph = FlowGraph(cls)
    lint.linter.run_checks(graph)  # `run`'s check of the graph, ours included
    environment = MetaflowEnvironment(flow_obj)
    datastore = FlowDataStore(flow_obj.name, environment, storage_impl=LocalStorage, ds_root=root)
    # Metaflow's own loop (decorators._init_step_decorators, as `run` and the
    # deployment commands call it): each step decorator's external_init, then its
    # step_init(flow, graph, step_name, decorators, environment, flow_datastore, logger).
    mf_decorators._init_step_decorators(flow_obj, graph, environment, datastore, logger)


def refusal(flow: str, env: Optional[Dict[str, str]] = None,
            args: Sequence[str] = ("--no-pylint", "run")) -> Refusal:
    """The refusal of ``flow`` at its start; fails the test if it would run."""
    refused = start(flow, env, args)
    assert refused is not None, "%s %s was not refused at its start" % (flow, " ".join(args))
    return refused
