"""A line a rank redraws with ``\\r`` (tqdm, HF's and Lightning's bars) shows
while it is redrawn: its latest state as a line of its own, at most every
REDRAW_SECONDS, never a growing line; the per-rank log keeps every byte, and
the relay holds at most one state of a line that never ends (issue 39)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import sys
import threading

from metaflow_extensions.torchrun.plugins.torchrun.base import timeouts
from metaflow_extensions.torchrun.plugins.torchrun.procs import redraw, relay
from metaflow_extensions.torchrun.plugins.torchrun.procs.redraw import collapse, last_state


def bar(i: int, total: int = 60) -> bytes:
    return b"\r%3d%%|%-20s| %d/%d [00:0%d<00:10, 5.50it/s]" % (100 * i // total, b"#" * (20 * i // total), i, total,
                                                             i % 10)


def test_the_last_state_is_the_last_piece_with_text_in_it():
    assert last_state(b"\rone\rtwo  ") == b"two"
    assert last_state(b"\rone\rtwo\r") == b"two"
    assert last_state(b"\rone\r   \r") == b"one"
    assert last_state(b"\r\r") == b""
    assert len(last_state(b"\r" + b"x" * 100000)) == redraw.MAX_STATE


def test_whole_lines_keep_only_their_last_state():
    assert collapse(b"plain\n") == b"plain\n"
    assert collapse(b"a\n\rbar 1\rbar 2\nb\ncrlf\r\n") == b"a\nbar 2\nb\ncrlf\n"
    # HF's 60 updates in one line of about 5,000 characters: one short line.
    whole = b"".join(bar(i) for i in range(61)) + b"\n"
    assert len(whole) > 2500 and collapse(whole) == bar(60)[1:] + b"\n"


class Console:
    """A RankStream whose console and log are pipes, read back whole."""

    def __init__(self, label=b"[rank2]: "):
        self.out_r, out_w = os.pipe()
        self.log_file = tempfile.TemporaryFile()  # a file, as the rank's log is: never full
        self.stream = relay.RankStream(out_w, relay.LineSplitter(label), os.dup(self.log_file.fileno()))
        os.set_blocking(self.out_r, False)
        self.console = bytearray()

    def read(self):
        while True:
            try:
                data = os.read(self.out_r, 1 << 20)
            except BlockingIOError:
                break
            if not data:
                break
            self.console.extend(data)
        return self

    @property
    def log(self):
        self.log_file.seek(0)
        return self.log_file.read()

    def lines(self):
        return bytes(self.read().console).splitlines()

    def close(self):
        self.stream.close(os.dup(self.out_r))  # closes the log's descriptor
        os.close(self.stream.out_fd)
        self.read()
        os.close(self.out_r)


def test_a_bar_shows_its_latest_state_every_few_seconds_and_ends_as_one_line():
    c = Console()
    every = timeouts.REDRAW_SECONDS
    try:
        c.stream.take(b"starting\n" + bar(0), now=100.0)
        assert c.lines() == [b"[rank2]: starting", b"[rank2]: " + bar(0)[1:]]  # the first state at once
        for i in range(1, 30):  # many redraws within one period: none shown
            c.stream.take(bar(i), now=100.0 + i * every / 40)
        assert len(c.lines()) == 2
        assert c.stream.redraw.due() == 100.0 + every
        assert c.stream.tick(100.0 + every)  # no new output: the state shows when due (select's timeout)
        assert c.lines()[-1] == b"[rank2]: " + bar(29)[1:]
        assert c.stream.tick(100.0 + 2 * every) and len(c.lines()) == 3  # nothing new: nothing again
        for i in range(30, 61):
            c.stream.take(bar(i), now=100.0 + every + 0.1)
        c.stream.take(b"\ndone\n", now=100.0 + every + 0.2)  # the bar closes: its final state, once
        assert c.lines()[3:] == [b"[rank2]: " + bar(60)[1:], b"[rank2]: done"]
        assert max(len(line) for line in c.lines()) < 100
    finally:
        c.close()
    # The log has every byte, as written, without labels.
    assert bytes(c.log) == b"starting\n" + b"".join(bar(i) for i in range(61)) + b"\ndone\n"


def test_a_final_state_already_shown_is_not_repeated_and_a_state_not_shown_is_not_lost():
    c = Console(label=b"")
    try:
        c.stream.take(b"\rfirst", now=0.0)
        c.stream.take(b"\r\n", now=0.5)  # "\r" then a newline: the state was shown, nothing more
        c.stream.take(b"\rsecond", now=1.0)  # not due yet (the last state was shown at 0)
        c.stream.take(b"\r", now=1.1)
        c.stream.take(b"\n", now=1.2)  # the line ends: its state not shown yet goes out now
        c.stream.take(b"\rthird\r", now=1.3)
        c.stream.take(b"\n", now=1.4)
        assert c.lines() == [b"first", b"second", b"third"]
        c.stream.take(b"\rfourth", now=20.0)
        c.stream.take(b"[W reducer.cpp] a warning from C++\n", now=20.1)  # another writer, same line
        assert c.lines()[3:] == [b"fourth", b"[W reducer.cpp] a warning from C++"]
        c.stream.take(b"\rfifth\r", now=30.0)
        c.stream.take(b"\rsixth\r", now=30.1)
        assert not c.stream.take(b"", now=30.2)  # the end: the state not shown yet, then done
        assert c.lines()[5:] == [b"fifth", b"sixth"]
    finally:
        c.close()


def test_a_line_that_never_ends_holds_at_most_one_state():
    c = Console()
    try:
        chunk = b"".join(bar(i % 61) for i in range(200))  # ~9 KB per read
        for n in range(1200):  # ~10 MB in all, no newline ever
            assert c.stream.take(chunk + bar(n % 61), now=n * 0.01)
            assert len(c.stream.splitter.pending) < 100
            if n % 5 == 0:
                c.read()
        lines = c.lines()
        # 12 s of it: a state at 0, 5 and 10 s.
        assert len(lines) == 3 and all(len(line) < 100 for line in lines), lines
        assert not c.stream.take(b"", now=20.0)  # the end: the last state goes out with the rest
    finally:
        c.close()
    assert len(c.log) == sum(len(chunk + bar(n % 61)) for n in range(1200)) + 1  # and the newline that ends it


def test_a_redrawn_line_in_a_log_only_section_stays_off_the_console():
    c = Console(label=b"")
    try:
        c.stream.take(relay.LOG_ONLY_BEGIN + b"\rhidden", now=0.0)
        c.stream.take(b"\n" + relay.LOG_ONLY_END + b"shown\n", now=10.0)
        assert c.lines() == [b"shown"]
    finally:
        c.close()
    assert bytes(c.log) == b"\rhidden\nshown\n"


WRITER = r"""
import sys, time
sys.stderr.write("epoch 1\n"); sys.stderr.flush()
for i in range(31):
    sys.stderr.write("\r%%d/30 steps" %% i); sys.stderr.flush()
    time.sleep(0.04)
time.sleep(%f)
open(%r, "w").close()
sys.stderr.write("\n"); sys.stderr.flush()
"""


def test_the_relay_shows_a_bar_while_the_rank_draws_it(tmp_path, monkeypatch):
    """A real writer and the relay's own loop: states arrive while the bar is
    drawn and while it pauses, before its newline."""
    monkeypatch.setattr(timeouts, "REDRAW_SECONDS", 0.4)
    done = str(tmp_path / "done")
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c", WRITER % (0.8, done)], stderr=in_w)
    os.close(in_w)
    got = []

    def drain():
        while True:
            data = os.read(out_r, 65536)
            if not data:
                break
            got.append((os.path.exists(done), data))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        relay._run({in_r: (out_w, relay.LineSplitter(b"[rank1]: "), None)})
    finally:
        os.close(out_w)
        writer.wait(timeout=30)
        reader.join(timeout=10)
        os.close(out_r)
    lines = b"".join(data for _, data in got).splitlines()
    before = b"".join(data for ended, data in got if not ended).splitlines()
    assert lines[0] == b"[rank1]: epoch 1" and lines[-1] == b"[rank1]: 30/30 steps", lines
    # Drawn for ~1.3 s, then silent 0.8 s: states every 0.4 s or so, the last of them during the pause.
    assert 3 <= len(before) <= 7, before
    assert before[-1] == b"[rank1]: 30/30 steps", before
    assert len(lines) == len(before)  # the final state was shown in the pause: not repeated


def test_a_line_without_its_newline_shows_as_it_stands_once_it_has_waited():
    """``print("saving...", end="")``: held for its newline, it reached the console only when the rank
    ended it, and never where its node's task was killed meanwhile (the relay's console was gone)."""
    c = Console()
    held = timeouts.HELD_LINE
    try:
        c.stream.take(b"epoch 1\nsaving step 80", now=10.0)
        assert c.lines() == [b"[rank2]: epoch 1"]  # not at once: a line written in pieces stays one line
        assert c.stream.redraw.due() == 10.0 + held
        c.stream.take(b"...", now=10.0 + held / 2)  # more of it: still the line that began at 10
        assert c.stream.tick(10.0 + held / 2) and len(c.lines()) == 1
        assert c.stream.tick(10.0 + held)
        assert c.lines()[1:] == [b"[rank2]: saving step 80..."]
        c.stream.take(b" done\nnext\n", now=20.0)  # its end: only what was not shown, as a line of its own
        assert c.lines()[2:] == [b"[rank2]:  done", b"[rank2]: next"]
        c.stream.take(b"x", now=30.0)
        c.stream.take(b"y\n", now=30.0 + held / 2)  # whole before it was due: one line, as written
        c.stream.take(b"last words", now=40.0)
        c.stream.tick(40.0 + held)
        assert c.lines()[4:] == [b"[rank2]: xy", b"[rank2]: last words"]
        assert not c.stream.take(b"", now=41.0)  # the rank ends (killed): they are not said twice
        assert len(c.lines()) == 6
    finally:
        c.close()
    assert bytes(c.log) == b"epoch 1\nsaving step 80... done\nnext\nxy\nlast words\n"  # the log: as written


def test_a_rank_that_stops_mid_line_has_it_on_the_console_before_it_ends(tmp_path):
    """A real writer and the relay's own loop: the writer stays mid-line until the console has shown
    the line (at most 20 s), then ends; without the hold's end the line came only with the writer's."""
    seen, done = str(tmp_path / "seen"), str(tmp_path / "done")
    code = ("import os, sys, time\nsys.stdout.write('checkpoint: saving'); sys.stdout.flush()\n"
            "deadline = time.monotonic() + 20\n"
            "while not os.path.exists(%r) and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
            "open(%r, 'w').close()\n" % (seen, done))
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=in_w)
    os.close(in_w)
    got = []

    def drain():
        while True:
            data = os.read(out_r, 65536)
            if not data:
                break
            got.append((os.path.exists(done), data))
            open(seen, "w").close()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        relay._run({in_r: (out_w, relay.LineSplitter(b"[rank1]: "), None)})
    finally:
        os.close(out_w)
        writer.wait(timeout=30)
        reader.join(timeout=10)
        os.close(out_r)
    assert got and not got[0][0], got  # while the writer was still mid-line
    assert b"".join(data for _, data in got) == b"[rank1]: checkpoint: saving\n"  # once
