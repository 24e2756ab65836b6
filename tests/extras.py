"""Packages the suite installs apart from the venv's site-packages, and how a test
that needs one runs with it.

metaflow-checkpoint is the one: Metaflow loads every installed extension in every
process it starts, so in site-packages it cost ``import metaflow`` about 0.04 CPU-s
(a whole task about 0.02) in each of the suite's ~800 Metaflow processes, nearly
all of which never use ``@checkpoint``.
``make install`` puts it in ``.venv/extras/checkpoint`` (requirements-checkpoint.txt);
a flow that uses it gets that folder on ``PYTHONPATH``, where Metaflow finds an
extension as it finds one installed. A user installs it the usual way.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, Mapping

CHECKPOINT_SITE = os.path.join(sys.prefix, "extras", "checkpoint")
NO_CHECKPOINT = "metaflow-checkpoint is not installed apart (make install puts it in %s)" % CHECKPOINT_SITE


def has_checkpoint() -> bool:
    return os.path.isdir(os.path.join(CHECKPOINT_SITE, "metaflow_extensions", "obcheckpoint"))


def with_checkpoint(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` with metaflow-checkpoint importable, ahead of anything on its ``PYTHONPATH``; a
    venv without it fails the test, saying how to get it, rather than its flow failing later."""
    assert has_checkpoint(), NO_CHECKPOINT
    path = [CHECKPOINT_SITE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(env, PYTHONPATH=os.pathsep.join(path))
