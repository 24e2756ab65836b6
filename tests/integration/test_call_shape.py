"""The shape of one call, measured on a real 2-node local flow
(``tools/shape/call_hops.py``, docs/design.md "The shape, measured"): a call
that starts crossing the layers back and forth again fails here, not in a
later review."""

from __future__ import annotations

import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "shape", "call_hops.py")


def test_a_call_reaches_torchruns_agent_in_under_40_hops_and_never_calls_back_up(gang):
    done = subprocess.run([sys.executable, TOOL, "--json"], env=gang.env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    shape = json.loads(done.stdout)
    hops = "\n".join(shape["hop_list"])
    assert shape["hops"] < 40, "%d hops (issue 34's target: under 40):\n%s" % (shape["hops"], hops)
    assert shape["upward"] == 0, hops
