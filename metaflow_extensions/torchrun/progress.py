"""Report a rank's training progress to ``@torchrun``: the short import path.

    from metaflow_extensions.torchrun.progress import report

    for step, batch in enumerate(loader):
        ...
        report(step, total=len(loader), loss=loss.item(), lr=sched.get_last_lr()[0])

It imports no Metaflow and no torch, so a rank loads it in milliseconds. Under
``@torchrun`` the control's log, the card and the result show the gang's step,
ETA, steps/s and the slowest node; elsewhere (plain ``python`` or ``torchrun``)
a report goes nowhere. docs/seeing-the-gang.md says what is shown.
"""

from metaflow_extensions.torchrun.plugins.torchrun.procs.rank_progress import report

__all__ = ["report"]
