"""A rank that logs line by line must not cost a wake-up per line in each hop of
the output path (the rank's relay, the supervisor's pump): both let a burst
settle for a moment and pass it on in a few large writes. Nothing is held back
for long: the first line of a burst goes out at once."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from proc_helpers import PY

from metaflow_extensions.torchrun.plugins.torchrun.procs import relay
from metaflow_extensions.torchrun.plugins.torchrun.runtime.supervisor import Supervisor

LINES = 2000
# One line every 100 microseconds, each its own write, as `logging` does.
TRICKLE = (
    "import os, time\n"
    "for i in range(%d):\n"
    "    os.write(1, b'line %%06d\\n' %% i)\n"
    "    time.sleep(0.0001)\n" % LINES
)
EXPECTED = b"".join(b"line %06d\n" % i for i in range(LINES))


def test_the_supervisor_pump_passes_a_trickle_on_in_few_writes():
    chunks = []
    sup = Supervisor([PY, "-c", TRICKLE], stdout_sink=chunks.append, stderr_sink=lambda c: None)
    with sup:
        assert sup.wait(interval=0.02) == 0
    assert b"".join(chunks) == EXPECTED
    # Unbatched, this is one write per line.
    assert len(chunks) < LINES // 5, len(chunks)


def test_the_relay_passes_a_trickle_on_in_few_writes(monkeypatch):
    writes = []
    real_write_all = relay.write_all

    def counting(fd, data):
        writes.append(len(data))
        return real_write_all(fd, data)

    monkeypatch.setattr(relay, "write_all", counting)
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    writer = subprocess.Popen([PY, "-c", TRICKLE], stdout=in_w)
    os.close(in_w)
    received = bytearray()

    def drain():
        while True:
            data = os.read(out_r, 65536)
            if not data:
                break
            received.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        relay._run({in_r: (out_w, relay.LineSplitter(b"[rank3]: "), None)})
    finally:
        os.close(out_w)
        writer.wait(timeout=30)
        reader.join(timeout=10)
        os.close(out_r)
    assert bytes(received) == relay.prefix_lines(EXPECTED, b"[rank3]: ")
    assert len(writes) < LINES // 5, len(writes)


def test_the_first_line_of_a_burst_is_not_held_back():
    """A lone line reaches the sink long before the writer's next line."""
    seen = []
    code = "import os, time\nos.write(1, b'first\\n')\ntime.sleep(1.5)\nos.write(1, b'second\\n')\n"
    sup = Supervisor([PY, "-c", code], stdout_sink=lambda c: seen.append((time.monotonic(), c)),
                     stderr_sink=lambda c: None)
    with sup:
        assert sup.wait(interval=0.02) == 0
    assert [c for _, c in seen] == [b"first\n", b"second\n"]
    assert seen[1][0] - seen[0][0] > 1.0
