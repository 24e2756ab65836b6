"""The private tree while a call runs (docs/seeing-the-gang.md): everything under
this user's base directory is closed to others, the warm process's log and
torch's own ``torchelastic_*`` directories included, and the ranks still get
the step's umask."""

from __future__ import annotations

import json
import os

from .helpers import output


def test_nothing_under_the_base_directory_is_open_to_others_during_a_call(gang, tmp_path):
    tmp = str(tmp_path / "tmp")
    os.makedirs(tmp)
    umask = os.umask(0o022)
    os.umask(umask)
    proc = gang.run("--script", "modes.py", "--nproc", "2", env={"TMPDIR": tmp})
    assert proc.returncode == 0, output(proc)
    for rank in range(4):
        with open(os.path.join(gang.out, "modes-%d.json" % rank)) as f:
            seen = json.load(f)
        assert seen["base"] == os.path.join(tmp, "metaflow-torchrun-%d" % os.geteuid())
        assert seen["seen"] > 10 and seen["loose"] == {}, seen
        assert seen["umask"] == umask  # the user's code keeps the step's own
