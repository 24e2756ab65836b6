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


class TestCollect:
    def test_a_rank_in_python_code_shows_its_line_and_all_its_threads(self, tmp_path, rank):
        p, script = rank("py")
        got = stacks.collect(str(tmp_path), {5: p.pid})
        text = got[5]
        assert 'line %d in main' % _line(script, "WAITS IN PYTHON") in text
        assert "in worker" in text  # the other thread too
        where = stacks.where(5, text)
        assert where.user is not None and where.user.line == _line(script, "WAITS IN PYTHON")
        assert where.threads == 2
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

    def test_a_dump_that_pauses_half_way_is_read_whole(self, tmp_path, procs):
        """On a starved host the writer can stop mid-dump for longer than a
        tick: a dump is whole once it reaches the main thread's outermost frame
        (the bootstrap runs as ``-m``). Here a stand-in writes its dump in two
        parts, 0.15 s apart."""
        halves = ('Thread 0x1 (most recent call first):\n  File "x.py", line 3 in serve\n\n'
                  'Current thread 0x2 (most recent call first):\n  File ',
                  '"train.py", line 9 in <module>\n  File "<frozen runpy>", line 198 in _run_module_as_main\n')
        writer = textwrap.dedent("""
            import os, signal, sys, time
            path, first, second = sys.argv[1:4]
            def dump(*_):
                with open(path, "a") as f:
                    f.write(first); f.flush(); time.sleep(0.15); f.write(second)
            signal.signal(int(sys.argv[4]), dump)
            print("ready", flush=True)
            time.sleep(60)
        """)
        path = stacks.stack_path(str(tmp_path), 5)
        open(path, "w").close()
        p = procs.popen([sys.executable, "-c", writer, path, *halves, str(int(stacks.STACK_SIGNAL))],
                        stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        assert stacks.collect(str(tmp_path), {5: p.pid}) == {5: "".join(halves)}

    @pytest.mark.parametrize("dump,whole", [
        ('Current thread 0x2 (most recent call first):\n  File "<frozen runpy>", line 198 in _run_module_as_main\n',
         True),
        ("Thread 0x1 (most recent call first):\n  File \"a.py\", line 1 in f\n\n...\n", True),  # the 100-thread cut
        ('Current thread 0x2 (most recent call first):\n  File "<frozen runpy>", line 198 in _run_module_as_main',
         False),  # the line's end not written yet
        ('Current thread 0x2 (most recent call first):\n  File "train.py", line 9 in <module>\n', False),
        ('Thread 0x1 (most recent call first):\n  ...\n', False),  # one thread's frames cut, more to come
    ])
    def test_a_dump_is_whole_at_the_main_threads_outermost_frame(self, dump, whole):
        assert stacks._whole(dump) is whole

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
    @pytest.mark.parametrize("value, expected", [
        ({"0": "a", "3": "b"}, {0: "a", 3: "b"}),
        ({"x": "a", "-1": "b", "1": 5, "2": None, str(1 << 40): "c"}, {}),
        ([["0", "a"]], {}),
        ("0", {}),
        (None, {}),
    ])
    def test_parse_wire_keeps_only_well_formed_entries(self, value, expected):
        assert stacks.parse_wire(value) == expected

    def test_parse_wire_cuts_long_texts(self):
        assert len(stacks.parse_wire({"0": "x" * (10 * stacks.MAX_STACK_BYTES)})[0]) == stacks.MAX_STACK_BYTES

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
