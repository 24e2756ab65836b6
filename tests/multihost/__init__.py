"""Multi-host tests: each node of a @torchrun step in its own "host" (a Linux
network namespace with its own IP address, host name and /etc/hosts), started
the way a Kubernetes JobSet or an AWS Batch multi-node job starts it.

Run (as root; otherwise every test that needs namespaces is skipped, with the
reason, and the rest runs)::

    METAFLOW_USER=dev PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m pytest tests/multihost -ra

``make test`` (and so ``.ci/run``) runs them with the rest of ``tests/``; select
or exclude them with ``-m multihost`` / ``-m "not multihost"``. With
MFTR_REQUIRE_MACHINE=1 (.ci/run sets it) a machine that cannot create namespaces
fails them instead of skipping them (tests/conftest.py).

- netns.py      hosts: namespaces, a bridge, per-host names, cutting a link
- contracts.py  what each platform gives each node, from Metaflow's own code
- platform_task.py  runs one node's Metaflow task as the platform does
- harness.py    a run: init, start, one task per host, join; leak checks
"""
