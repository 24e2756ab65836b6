"""Run one Metaflow command the way a JobSet pod or an AWS Batch node runs it:

    python platform_task.py FLOW_FILE [flow.py arguments ...]

The harness puts ``--with kubernetes`` or ``--with batch`` in the arguments, as
the command Metaflow writes into the JobSet / Batch job does, so Metaflow's own
compute decorator takes part in the task exactly as it does there:

- its ``task_pre_step`` translates the platform's environment into
  ``MF_PARALLEL_*`` with the module-level ``_setup_multinode_environment``
  (Kubernetes: the workers wait until MF_MASTER_ADDR resolves; Batch: the main
  node takes the address its own host name resolves to);
- it names the other nodes' tasks for the join step
  (``flow._control_mapper_tasks``: ``<id>-worker-<i>`` / ``<id>-node-<i>``);
  without that the control task fails at its end;
- on Batch its ``task_finished`` makes the control wait for the other nodes.

One thing is changed, and only here: both decorators' ``step_init`` refuse a
datastore that is not an object store. In the harness the nodes share a local
datastore directory standing in for S3, so ``step_init`` is shown a datastore
whose TYPE reads "s3" (everything else is the real one). Nothing else is patched.
"""

import os
import sys


class _AsObjectStore:
    """The real flow datastore, reporting TYPE "s3" to the compute decorators'
    step_init check only."""

    TYPE = "s3"

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


def _accept_shared_local_datastore(cls):
    original = cls.step_init

    def step_init(self, flow, graph, step, decos, environment, flow_datastore, logger):
        original(self, flow, graph, step, decos, environment, _AsObjectStore(flow_datastore), logger)
        self.flow_datastore = flow_datastore

    cls.step_init = step_init


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: platform_task.py FLOW_FILE [args...]")
    flow_file = os.path.abspath(sys.argv[1])
    import metaflow  # noqa: F401  (loads extensions, @torchrun included)
    from metaflow.plugins.aws.batch.batch_decorator import BatchDecorator
    from metaflow.plugins.kubernetes.kubernetes_decorator import KubernetesDecorator

    _accept_shared_local_datastore(KubernetesDecorator)
    _accept_shared_local_datastore(BatchDecorator)
    # As `python flow.py ...` would see it. The flow runs in the real __main__
    # module (not runpy's temporary one): Metaflow registers pickled types such
    # as ForeachFrame on __main__ when it is imported.
    sys.argv = [flow_file] + sys.argv[2:]
    sys.path[0] = os.path.dirname(flow_file)
    import __main__

    __main__.__file__ = flow_file
    with open(flow_file, "rb") as f:
        code = compile(f.read(), flow_file, "exec")
    exec(code, __main__.__dict__)


if __name__ == "__main__":
    main()
