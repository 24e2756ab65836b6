"""stacks.py: dumping a live process's stacks through faulthandler and reading
them back, with real processes; reading dumps; the failure message's summary;
stacks from the wire."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from plans import agent_environment
from proc_helpers import wait_until

from metaflow_extensions.torchrun.plugins.torchrun.host.proctree import signal_main_thread
from metaflow_extensions.torchrun.plugins.torchrun.procs import stacks

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(stacks.__file__)))))

# A "rank": registers like the bootstrap does, says where it will wait, then
# waits in one of three ways (Python sleep, a C-level lock, a thread).
RANK = textwrap.dedent(
    """
    import os, sys, threading, time
    sys.path.insert(0, sys.argv[3])
    from metaflow_extensions.torchrun.plugins.torchrun.procs import stacks
    keep = stacks.register(sys.argv[1], 5)
    mode = sys.argv[2]

    def worker():
        time.sleep(600)

    def blocked_in_c():
        threading.Lock().acquire(); threading.Lock()
        lock = threading.Lock(); lock.acquire()
        print("ready", flush=True)
        lock.acquire()  # WAITS IN C

    def main():
        threading.Thread(target=worker, name="loader", daemon=True).start()
        if mode == "c":
            blocked_in_c()
        print("ready", flush=True)
        time.sleep(600)  # WAITS IN PYTHON

    main()
    """
)


@pytest.fixture
def rank(tmp_path, procs):
    script = tmp_path / "rank_script.py"
    script.write_text(RANK)

    def start(mode="py"):
        p = procs.popen([sys.executable, str(script), str(tmp_path), mode, PKG_ROOT],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready", p.stderr.read()
        time.sleep(0.3)  # past the print, into the wait
        return p, script

    return start


def _line(script, marker):
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if marker in line)


# A "rank" whose other thread runs Python all the time, pushing and popping
# frames, as the Flight Recorder's thread does when it is asked.
BUSY_RANK = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, sys.argv[2])
    from metaflow_extensions.torchrun.plugins.torchrun.procs import stacks
    keep = stacks.register(sys.argv[1], 5)

    def deep(n):
        return 0 if n == 0 else deep(n - 1) + 1

    def churn():
        while True:
            deep(300)
            [str(i) for i in range(50)]

    def main():
        threading.Thread(target=churn, daemon=True).start()
        print("ready", flush=True)
        time.sleep(600)  # WAITS HERE

    main()
    """
)


def _answered(path):
    """The dumps a rank wrote whole into its stack file: each ends with its
    outermost frame, the script's top level."""
    with open(path) as f:
        return f.read().count(" in <module>\n")


# A dump in two parts, as a stand-in for faulthandler writes it.
HALVES = ('Stack (most recent call first):\n  File "train.py", line 9 in step\n  File "tr',
          'ain.py", line 20 in <module>\n  File "<frozen runpy>", line 198 in _run_module_as_main\n')


def _stand_in(tmp_path, procs, pause):
    """A process whose stack file says its dumps end at runpy's outermost frame
    and that, asked, writes ``HALVES`` ``pause`` seconds apart."""
    writer = textwrap.dedent("""
        import signal, sys, time
        path, first, second, pause = sys.argv[1:5]
        def dump(*_):
            with open(path, "a") as f:
                f.write(first); f.flush(); time.sleep(float(pause)); f.write(second)
        signal.signal(int(sys.argv[5]), dump)
        print("ready", flush=True)
        time.sleep(120)
    """)
    path = stacks.stack_path(str(tmp_path), 5)
    with open(path, "w") as f:
        f.write("\t".join((stacks._ENDS_WITH, "<frozen runpy>", "_run_module_as_main")) + "\n")
    p = procs.popen([sys.executable, "-c", writer, path, *HALVES, str(pause), str(int(stacks.STACK_SIGNAL))],
                    stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    return p


class TestCollect:
    def test_a_rank_in_python_code_shows_its_main_threads_line_alone(self, tmp_path, rank):
        p, script = rank("py")
        got = stacks.collect(str(tmp_path), {5: p.pid})
        text = got[5]
        assert 'line %d in main' % _line(script, "WAITS IN PYTHON") in text
        assert "in worker" not in text and not text.startswith(stacks.UNFINISHED)  # whole, its thread alone
        where = stacks.where(5, text)
        assert where.user is not None and where.user.line == _line(script, "WAITS IN PYTHON")
        assert where.threads == 1 and not where.unfinished
        assert p.poll() is None  # a dump does not stop the rank

    def test_a_rank_blocked_in_a_c_call_still_answers(self, tmp_path, rank):
        p, script = rank("c")
        text = stacks.collect(str(tmp_path), {5: p.pid})[5]
        where = stacks.where(5, text)
        assert (where.user.function, where.user.line) == ("blocked_in_c", _line(script, "WAITS IN C"))

    def test_a_second_dump_is_read_on_its_own(self, tmp_path, rank):
        p, _ = rank("py")
        first = stacks.collect(str(tmp_path), {5: p.pid})[5]
        second = stacks.collect(str(tmp_path), {5: p.pid})[5]
        assert second == first  # the same place, not both dumps

    def test_a_stopped_rank_gives_nothing_within_the_bound(self, tmp_path, rank):
        p, _ = rank("py")
        os.kill(p.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            assert stacks.collect(str(tmp_path), {5: p.pid}, seconds=0.5) == {}
            assert time.monotonic() - t0 < 2
        finally:
            os.kill(p.pid, signal.SIGCONT)

    def test_a_rank_whose_other_thread_runs_python_survives_being_asked_again_and_again(self, tmp_path, procs):
        """The crash behind a CI flake (issue 50): asked for every thread,
        faulthandler walked the frames of a thread running Python (the Flight
        Recorder's answers at that moment) and read one freed under it: the
        rank died of SIGSEGV, its dump cut short ('no Python frame'). Its main
        thread alone cannot change while it dumps."""
        script = tmp_path / "busy_rank.py"
        script.write_text(BUSY_RANK)
        p = procs.popen([sys.executable, str(script), str(tmp_path), PKG_ROOT], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        asked = 0
        for _ in range(1000):  # the old dump crashed this rank within 300 in 10 of 10 tries
            signal_main_thread(p.pid, stacks.STACK_SIGNAL)
            asked += 1
            time.sleep(0.001)
            if p.poll() is not None:
                break
        # A real-time signal queues: a rank starved of CPU answers these later,
        # and a collect begun before it had read them with its own (3 dumps
        # read as one, in CI). Once every one is answered whole (each dump ends
        # with the rank's outermost frame) and survived, the collect's ask is
        # the only one left.
        path = stacks.stack_path(str(tmp_path), 5)
        wait_until(lambda: _answered(path) == asked or p.poll() is not None, 120)
        assert p.poll() is None, "the rank died of signal %d while dumping" % -p.returncode
        assert _answered(path) == asked, "%d of %d asks answered" % (_answered(path), asked)
        text = stacks.collect(str(tmp_path), {5: p.pid}, seconds=30)[5]
        where = stacks.where(5, text)
        assert (where.user.function, where.user.line, where.threads) == ("main", _line(script, "WAITS HERE"), 1)

    def test_a_dump_is_read_once_whole_however_long_its_writer_pauses(self, tmp_path, procs):
        """On a starved host the writer can stop mid-dump: the node waits, up
        to its bound, for the dump's last line, its outermost frame's (the file
        says which). It once took 0.25 s without growth for the end and read
        half a dump. Here a stand-in writes one in two parts, 0.6 s apart."""
        p = _stand_in(tmp_path, procs, 0.6)
        assert stacks.collect(str(tmp_path), {5: p.pid}, seconds=30) == {5: "".join(HALVES)}

    def test_a_dump_unfinished_at_the_bound_is_kept_and_says_so(self, tmp_path, procs):
        p = _stand_in(tmp_path, procs, 60)
        # 5 s: a CI run, 17 s in, as every worker started, had nothing of the first half written within 0.5 s.
        text = stacks.collect(str(tmp_path), {5: p.pid}, seconds=5)[5]
        assert text == stacks.UNFINISHED + "\n" + HALVES[0].rsplit("\n", 1)[0] + "\n"  # whole lines only
        where = stacks.where(5, text)
        assert where.unfinished and where.lines() == [
            "rank 5: train.py:9 in step",
            "    (from a dump it had not finished in time: its outer frames are missing)"]
        assert stacks.where(5, stacks.UNFINISHED + "\nStack (most recent call first):\n").place() == (
            "its stack dump was not finished in time",)

    @pytest.mark.parametrize("tail,whole", [
        ('  File "train.py", line 9 in step\n  File "<frozen runpy>", line 198 in _run_module_as_main\n', True),
        ('  File "<frozen runpy>", line 198 in _run_module_as_main', False),  # the line's end not written yet
        ('  File "train.py", line 9 in <module>\n', False),
        ('  File "<frozen runpy>", line 88 in _run_code\n', False),  # another function of the same file
        ("  File \"a.py\", line 1 in f\n  ...\n", True),  # faulthandler's cut after 100 frames
        ("Stack (most recent call first):\n  <no Python frame>\n", True),
    ])
    def test_a_dump_is_whole_at_the_outermost_frame_its_file_names(self, tail, whole):
        assert stacks._whole(tail, ("<frozen runpy>", "_run_module_as_main")) is whole
        assert not stacks._whole(tail, None) or tail.endswith(("  ...\n", "<no Python frame>\n"))

    def test_the_outermost_frame_is_named_as_faulthandler_writes_it(self):
        def inner():
            return stacks.ending(sys._getframe())

        root = sys._getframe()
        while root.f_back is not None:
            root = root.f_back
        assert inner() == (root.f_code.co_filename, root.f_code.co_name)
        assert stacks.escaped("caf\u00e9 \u20ac\U0001f600\t") == "caf\\xe9 \\u20ac\\U0001f600\\x09"
        assert stacks.escaped("x" * 501) == "x" * 500 + "..."

    def test_a_gone_rank_is_skipped(self, tmp_path, rank):
        p, _ = rank("py")
        p.kill()
        p.wait()
        assert stacks.collect(str(tmp_path), {5: p.pid}, seconds=0.3) == {}

    def test_the_stack_file_is_never_followed_through_a_symlink(self, tmp_path):
        target = tmp_path / "elsewhere"
        target.write_text("keep")
        os.symlink(target, stacks.stack_path(str(tmp_path), 7))
        assert stacks.register(str(tmp_path), 7) is None
        assert target.read_text() == "keep"
        assert stacks._read_from(stacks.stack_path(str(tmp_path), 7), 0) == ""

    def test_no_directory_or_rank_registers_nothing(self):
        assert stacks.register(None, 0) is None
        assert stacks.register("/x", -1) is None


# A rank still importing: its script imports a library (a module under a
# ``site-packages`` directory) that sleeps at import time; "lock" has a thread
# import it first, so the main thread waits on the import's module lock, where
# only the import machinery's frames are innermost.
IMPORTER = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, sys.argv[3])
    sys.path.insert(0, sys.argv[4])
    from metaflow_extensions.torchrun.plugins.torchrun.procs import stacks
    keep = stacks.register(sys.argv[1], 5)
    if sys.argv[2] == "lock":
        threading.Thread(target=__import__, args=("slowlib",), daemon=True).start()
        time.sleep(0.5)
    print("ready", flush=True)
    import slowlib  # IMPORTS
    """
)


class TestImporting:
    @pytest.fixture
    def importer(self, tmp_path, procs):
        lib = tmp_path / "venv" / "lib" / "site-packages"
        lib.mkdir(parents=True)
        (lib / "slowlib.py").write_text("import time\ntime.sleep(600)  # SLEEPS AT IMPORT\n")
        script = tmp_path / "train.py"
        script.write_text(IMPORTER)

        def start(mode):
            p = procs.popen([sys.executable, str(script), str(tmp_path), mode, PKG_ROOT, str(lib)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert p.stdout.readline().strip() == b"ready", p.stderr.read()
            time.sleep(0.5)  # past the print, into the import
            return stacks.collect(str(tmp_path), {5: p.pid})[5], script

        return start

    def test_a_rank_importing_a_library_says_importing_it(self, importer, tmp_path):
        text, script = importer("run")
        assert "slowlib.py\", line 2 in <module>" in text  # the library's own frame is innermost
        place = stacks.where(5, text).place(base=str(tmp_path))
        assert place == ("importing slowlib", "    from train.py:%d in <module>: import slowlib  # IMPORTS"
                         % _line(script, "# IMPORTS"))

    def test_a_rank_waiting_for_an_import_lock_names_the_module_not_importlib(self, importer, tmp_path):
        text, script = importer("lock")
        main = stacks.main_thread(stacks.parse(text))
        assert main is not None and main.frames[0].file.startswith("<frozen importlib")  # the symptom
        summary = stacks.summarize({5: text}, base=str(tmp_path))
        assert "rank 5: importing slowlib" in summary and "<frozen importlib" not in summary

    def test_a_users_own_module_sleeping_at_import_shows_its_line(self, tmp_path):
        dump = ('Current thread 0x1 (most recent call first):\n'
                '  File "/work/data.py", line 2 in <module>\n'
                '  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
                '  File "/work/train.py", line 1 in <module>\n')
        assert stacks.where(0, dump).place(base="/work") == ("data.py:2 in <module>",)

    @pytest.mark.parametrize("line, name", [
        ("import torch", "torch"), ("import torch.nn as nn", "torch.nn"), ("from a.b import c", "a.b"),
        ("  import x, y", "x"), ("from . import x", None), ("x = 1", None), ("", None)])
    def test_the_module_an_import_line_names(self, line, name):
        assert stacks.imported_module(line) == name

    @pytest.mark.parametrize("path, name", [
        ("/v/lib/python3.11/site-packages/torch/nn/__init__.py", "torch.nn"),
        ("/v/lib/python3.11/site-packages/torch/_C.cpython-311.so", None),
        ("/work/train.py", None)])
    def test_a_library_modules_name_from_its_file(self, path, name):
        assert stacks.module_name(path) == name


DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2950 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/train.py", line 42 in step
  File "/work/train.py", line 60 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


class TestReading:
    def test_threads_and_frames(self):
        threads = stacks.parse(DUMP)
        assert [(t.ident, t.current, len(t.frames)) for t in threads] == [
            ("0x00007f0000000002", False, 2), ("0x00007f0000000001", True, 5)]
        assert threads[1].frames[2] == stacks.Frame("/work/train.py", 42, "step")

    def test_the_main_thread_is_the_one_running_a_module(self):
        dump = DUMP.replace("Current thread 0x00007f0000000001", "Thread 0x00007f0000000001").replace(
            "Thread 0x00007f0000000002", "Current thread 0x00007f0000000002")
        main = stacks.main_thread(stacks.parse(dump))
        assert main is not None and main.ident == "0x00007f0000000001"

    def test_innermost_user_frame_skips_installed_packages(self):
        where = stacks.where(3, DUMP)
        assert where.user == stacks.Frame("/work/train.py", 42, "step")
        assert where.innermost is not None and where.innermost.function == "all_reduce"
        lines = where.lines(base="/work")
        assert lines[0] == "rank 3: train.py:42 in step"
        assert lines[1] == "    innermost: torch/distributed/distributed_c10d.py:2950 in all_reduce"

    def test_a_dump_without_user_code_names_the_innermost_frame(self):
        dump = 'Current thread 0x1 (most recent call first):\n  File "<frozen runpy>", line 88 in _run_code\n'
        assert stacks.where(0, dump).lines() == ["rank 0: <frozen runpy>:88 in _run_code"]

    def test_a_rank_stopped_in_our_own_start_or_end_says_so_without_our_paths(self):
        """Seen in CI: a node killed as its peer's rank 0 wrote its status on the
        way in; the failure screen showed our records.py, which tells a user nothing."""
        ours = os.path.join(os.path.dirname(stacks.__file__), "records.py")
        boot = os.path.join(os.path.dirname(stacks.__file__), "bootstrap.py")
        dump = ('Current thread 0x1 (most recent call first):\n  File "%s", line 26 in write_json\n'
                '  File "%s", line 240 in main\n  File "<frozen runpy>", line 88 in _run_code\n' % (ours, boot))
        line = stacks.where(0, dump).lines()[0]
        assert line == "rank 0: outside your script, in @torchrun's own start or end of the rank (records.write_json)"
        assert os.path.dirname(stacks.__file__) not in line

    def test_a_rank_in_a_library_our_end_called_is_said_to_be_in_our_end(self):
        """Seen in CI: an echo stopped while its exception was written to torch's
        error file; the failure screen showed torch's error_handler.py frame."""
        torch_file = os.path.join(os.path.dirname(os.__file__), "site-packages", "torch", "distributed", "elastic",
                                  "multiprocessing", "errors", "error_handler.py")
        boot = os.path.join(os.path.dirname(stacks.__file__), "bootstrap.py")
        dump = ('Current thread 0x1 (most recent call first):\n  File "%s", line 87 in record_exception\n'
                '  File "%s", line 101 in torch_error_file\n  File "%s", line 80 in _record\n'
                '  File "<frozen runpy>", line 88 in _run_code\n' % (torch_file, boot, boot))
        line = stacks.where(0, dump).lines()
        assert line == ["rank 0: outside your script, in @torchrun's own start or end of the rank "
                        "(bootstrap.torch_error_file)"], line

    def test_a_rank_in_our_preflight_program_is_said_as_in_a_script_even_inside_a_library(self):
        """The preflight's collective check is shown as a user's script is (its line),
        also when the dump's innermost frame is a library's it called."""
        program = os.path.join(os.path.dirname(stacks.__file__), "collective_check.py")
        boot = os.path.join(os.path.dirname(stacks.__file__), "bootstrap.py")
        torch_file = os.path.join(os.path.dirname(os.__file__), "site-packages", "torch", "distributed",
                                  "distributed_c10d.py")
        frames = '  File "%s", line 70 in preflight_job\n  File "%s", line 240 in main\n' % (program, boot)
        for inner in ("", '  File "%s", line 2950 in all_reduce\n' % torch_file):
            dump = "Current thread 0x1 (most recent call first):\n" + inner + frames
            line = stacks.where(0, dump).lines()[0]
            assert line.startswith("rank 0: ") and "collective_check.py:70 in preflight_job" in line, line
            assert "all_reduce" not in line and "outside your script" not in line, line

    @pytest.mark.parametrize("text", ["", "garbage\n\x00\x01", "Thread 0xzz\n  File nothing"])
    def test_garbage_is_read_as_no_frame(self, text):
        assert stacks.where(1, text).lines() == ["rank 1: no Python frame in its dump"]

    def test_summary_groups_ranks_at_the_same_place(self):
        text = stacks.summarize({r: DUMP for r in range(40)}, base="/work")
        lines = text.splitlines()
        assert lines[1] == "  ranks 0-39 (40): train.py:42 in step"
        assert lines[2] == "      innermost: torch/distributed/distributed_c10d.py:2950 in all_reduce"
        assert len(lines) == 3
        assert stacks.summarize({}) == ""

    def test_summary_at_8192_ranks_is_short_odd_ones_first_every_place_named(self):
        odd = {17: DUMP.replace("line 42 in step", "line 77 in step"),
               4000: DUMP.replace("line 42 in step", "line 91 in evaluate")}
        dumps = {r: odd.get(r, DUMP) for r in range(8192)}
        lines = stacks.summarize(dumps, base="/work").splitlines()
        assert len(lines) <= 40
        assert lines[1] == "  rank 17: train.py:77 in step"
        assert lines[3] == "  rank 4000: train.py:91 in evaluate"
        assert lines[5] == "  ranks 0-16, 18-3999, 4001-8191 (8190): train.py:42 in step"

    def test_summary_with_more_places_than_it_shows_counts_the_rest(self):
        dumps = {r: DUMP.replace("line 42 in step", "line %d in step" % (100 + r)) for r in range(8192)}
        lines = stacks.summarize(dumps, base="/work", limit=12).splitlines()
        assert len(lines) <= 40
        assert lines[-1] == "  ... and 8180 more places (8180 ranks)"


class TestWire:
    def test_bound_keeps_the_innermost_frames_of_each_rank(self):
        got = stacks.bound({r: "INNER" + "x" * 10000 for r in range(8)}, 8 * 1024)
        assert sorted(got) == list(range(8)) and all(t.startswith("INNER") and len(t) == 1024 for t in got.values())
        assert len(stacks.bound({r: "x" for r in range(100)}, 2048)) == 4


def test_the_bootstrap_registers_before_user_code(tmp_path, procs):
    """Through the real bootstrap: a script's stacks, by the rank's own file name."""
    from metaflow_extensions.torchrun.plugins.torchrun.procs import bootstrap, entry

    script = tmp_path / "user.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)  # HERE\n")
    work = tmp_path / "work"
    work.mkdir()
    entry_path = entry.write_entry(str(work), [str(script)])
    env = dict(os.environ, RANK="2", LOCAL_RANK="0", PYTHONPATH=PKG_ROOT,
               **{bootstrap.WORK_DIR_ENV: str(work), bootstrap.LABELS_ENV: "0"})
    env.update(agent_environment(env, str(work), entry_path, label_logs=False))
    p = procs.popen([sys.executable, "-m", bootstrap.__name__, entry_path], env=env, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    time.sleep(0.3)
    assert wait_until(lambda: os.path.exists(stacks.stack_path(str(work), 2)), 5)
    text = stacks.collect(str(work), {2: p.pid})[2]
    assert 'user.py", line 3 in <module>' in text
    where = stacks.where(2, text)  # the main thread, though python -m started it
    assert where.user is not None and (where.user.line, where.user.function) == (3, "<module>")
