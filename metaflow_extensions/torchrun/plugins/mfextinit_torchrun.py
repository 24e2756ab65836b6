"""Registers ``@torchrun`` with Metaflow's extension mechanism.

Metaflow discovers this file by its ``mfextinit_<org>.py`` name; the tuple's path is
relative to this package so the implementation can live in small modules.
"""

STEP_DECORATORS_DESC = [("torchrun", ".torchrun.decorator.TorchrunDecorator")]
# `python flow.py torchrun history`: the node history (record/node_history.py).
CLIS_DESC = [("torchrun", ".torchrun.cli.cli")]
