"""The private tree while a call runs (docs/seeing-the-gang.md): everything under
this user's base directory is closed to others, the warm process's log and
torch's own ``torchelastic_*`` directories included, and the ranks still get
the step's umask."""

from __future__ import annotations

import os


def test_nothing_under_the_base_directory_is_open_to_others_during_a_call(calls_run):
    # The call "modes" of calls.CALLS (modes.py, 2 x 2), late in the run: the
    # earlier calls' logs are in the tree it walks too.
    umask = os.umask(0o022)
    os.umask(umask)
    assert calls_run.returncode == 0, calls_run.text[-4000:]
    modes = calls_run.reports("modes", "modes-")
    assert sorted(modes) == [0, 1, 2, 3]
    for seen in modes.values():
        assert seen["base"] == os.path.join(calls_run.tmpdir, "metaflow-torchrun-%d" % os.geteuid())
        assert seen["seen"] > 10 and seen["loose"] == {}, seen
        assert seen["umask"] == umask  # the user's code keeps the step's own
