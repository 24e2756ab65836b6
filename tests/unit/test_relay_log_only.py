"""A rank's own traceback goes to its log only (issue 36): the bootstrap marks
it, the relay keeps it off the console and whole in the log, markers dropped;
every other line goes to both, in order."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from metaflow_extensions.torchrun.plugins.torchrun.procs import relay

RANK = r"""
import sys, os
sys.stderr.write("before\n")
sys.stderr.write(%r + "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: x\n" + %r)
sys.stderr.write("after\n")
""" % (relay.LOG_ONLY_BEGIN.decode(), relay.LOG_ONLY_END.decode())


def test_the_marked_traceback_reaches_the_log_only():
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    log_r, log_w = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c", RANK], stderr=in_w)
    os.close(in_w)
    got = {out_r: bytearray(), log_r: bytearray()}

    def drain(fd):
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            got[fd].extend(data)

    readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (out_r, log_r)]
    for t in readers:
        t.start()
    try:
        relay._run({in_r: (out_w, relay.LineSplitter(b"[rank1]: "), log_w)})  # closes in_r and log_w
    finally:
        os.close(out_w)
        writer.wait(timeout=30)
        for t in readers:
            t.join(timeout=10)
        os.close(out_r)
        os.close(log_r)
    assert bytes(got[out_r]) == b"[rank1]: before\n[rank1]: after\n"
    assert bytes(got[log_r]) == (b"before\nTraceback (most recent call last):\n  File \"t.py\", line 1\n"
                                 b"ValueError: x\nafter\n")


def test_log_only_splits_whole_lines_and_passes_the_rest_untouched():
    quiet = relay.LogOnly()
    plain = b"a\nb\n"
    assert quiet.split(plain) == (plain, plain)
    assert quiet.split(relay.LOG_ONLY_BEGIN + b"tb\n") == (b"", b"tb\n")
    assert quiet.split(b"more\n" + relay.LOG_ONLY_END + b"c\n") == (b"c\n", b"more\nc\n")
