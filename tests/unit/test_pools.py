"""Issue 50: `make test` as two pools (tools/pools.py) with one verdict, and
the markers that sort tests into them (tests/conftest.py)."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))

import pools  # noqa: E402


def _load_markers():
    """tests/conftest.py itself, under a name of its own (every folder has a conftest)."""
    spec = importlib.util.spec_from_file_location("root_conftest", os.path.join(REPO, "tests", "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


markers = _load_markers()


@pytest.mark.parametrize("key", sorted(set(markers.WAITS) | set(markers.SLOW)))
def test_every_listed_test_exists(key):
    """A renamed test or file would leave its pool silently: every key names a
    file that exists, and a test defined in it (a parameter id is not checked)."""
    path, _, test = key.partition("::")
    assert os.path.isfile(os.path.join(REPO, path)), path
    if test:
        name = test.split("[", 1)[0]
        with open(os.path.join(REPO, path)) as f:
            assert re.search(r"^\s*def %s\(" % re.escape(name), f.read(), re.M), key


def test_a_key_covers_its_file_its_test_and_its_parameters_only():
    table = {"tests/a.py::test_x": "", "tests/b.py": ""}
    assert markers.listed("tests/a.py::test_x", table)
    assert markers.listed("tests/a.py::test_x[one]", table)
    assert markers.listed("tests/b.py::TestY::test_z", table)
    assert not markers.listed("tests/a.py::test_x_more", table)
    assert not markers.listed("tests/a.py::test_y", table)
    assert not markers.listed("tests/bb.py::test_z", table)


def test_the_pools_split_the_suite_and_a_selection_narrows_both():
    cpu, waits = pools.pools(2, 4)
    assert (cpu.marks, cpu.workers, waits.marks, waits.workers) == ("not waits", 2, "waits", 4)
    cpu, waits = pools.pools(2, 4, "not slow")
    assert (cpu.marks, waits.marks) == ("(not slow) and (not waits)", "(not slow) and (waits)")
    argv = pools.pytest_argv(waits.marks, waits.workers, "w.xml", ["-ra"])
    assert argv[3:] == ["tests", "-n", "4", "-m", waits.marks, "--dist", "worksteal", "--junitxml", "w.xml", "-ra"]


def test_the_wait_bound_pool_collects_only_the_files_its_table_names():
    """Its workers collect those files, not all of tests/ (about 12 CPU-s each): every
    file a WAITS key names, and no other, so no test marked `waits` is left out."""
    cpu, waits = pools.pools(2, 4)
    assert cpu.paths == ()
    assert set(waits.paths) == {key.split("::")[0] for key in markers.WAITS}
    argv = pools.pytest_argv(waits.marks, waits.workers, None, ["-ra"], waits.paths)
    assert argv[3:3 + len(waits.paths)] == list(waits.paths) and "tests" not in argv
    # Paths the caller names still replace them.
    assert pools.pytest_argv(waits.marks, 4, None, ["tests/unit"], waits.paths)[3:5] == ["-n", "4"]


def test_paths_among_the_arguments_replace_the_whole_suite():
    assert pools.pytest_argv("waits", 4, None, ["tests/unit", "-ra"])[3:] == [
        "-n", "4", "-m", "waits", "--dist", "worksteal", "tests/unit", "-ra"]
    assert pools.pytest_argv("", 0, None, ["tests/unit/test_pools.py::test_x", "-k", "y"])[3:] == [
        "-n", "0", "tests/unit/test_pools.py::test_x", "-k", "y"]
    assert pools.pytest_argv("", 0, None, ["-k", "y"])[3:] == ["tests", "-n", "0", "-k", "y"]


def test_a_pools_timeline_folder_is_not_taken_for_a_test_path(tmp_path):
    """The folder exists when the pool starts: given as a word apart, it read as a path,
    and pytest ran without tests/ and without the conftest that knows --timeline."""
    (tmp_path / "cpu-bound").mkdir()
    cpu, _ = pools.pools(3, 4)
    argv = pools.pool_argv(cpu, "cpu.xml", str(tmp_path), ["-ra"])
    assert argv[3] == "tests" and "--timeline=%s" % (tmp_path / "cpu-bound") in argv, argv


@pytest.mark.parametrize("statuses, expected", [
    ((0, 0), 0), ((0, 5), 0), ((5, 0), 0), ((5, 5), 5), ((1, 0), 1), ((0, 1), 1), ((0, 2), 1), ((5, 1), 1),
])
def test_the_verdict_fails_if_either_pool_failed(statuses, expected):
    both = pools.pools(2, 4)
    assert pools.verdict([pools.Outcome(p, s) for p, s in zip(both, statuses)]) == expected


def test_a_real_pytest_runs_junit_is_summed_up_naming_the_failed_test(tmp_path):
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test_some.py").write_text(
        "import pytest\n\n"
        "def test_ok():\n    pass\n\n"
        "def test_bad():\n    assert False\n\n"
        "class TestGroup:\n    def test_inner(self):\n        assert False\n\n"
        "@pytest.mark.skip(reason='no')\ndef test_skipped():\n    pass\n")
    junit = tmp_path / "out.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(folder), "--junitxml", str(junit)],
                          cwd=str(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout
    counts, failed = pools.read_junit(str(junit), root=str(tmp_path))
    assert counts.pop("time") > 0 and counts == {"tests": 4, "failures": 2, "errors": 0, "skipped": 1}
    assert failed == ["tests/test_some.py::test_bad", "tests/test_some.py::TestGroup::test_inner"], failed
    cpu, waits = pools.pools(2, 4)
    outcomes = [pools.Outcome(cpu, 0, {"tests": 3, "failures": 0, "errors": 0, "skipped": 0, "time": 10.0}),
                pools.Outcome(waits, 1, dict(counts, time=20.0), failed)]
    lines = pools.summary(outcomes)
    assert lines[0] == "cpu-bound pool (-m 'not waits', 2 workers): 3 passed, 0 failed, 0 errors, 0 skipped " \
                       "in 10 s (pytest exit 0)"
    assert lines[1] == "wait-bound pool (-m 'waits', 4 workers): 1 passed, 2 failed, 0 errors, 1 skipped " \
                       "in 20 s (pytest exit 1)"
    assert [line.strip() for line in lines[2:4]] == ["FAILED " + f for f in failed]
    assert lines[-1].startswith("FAILED")


def test_a_pool_that_wrote_no_junit_counts_nothing(tmp_path):
    assert pools.read_junit(str(tmp_path / "none.xml")) == (
        {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}, [])


def test_a_node_id_is_read_back_from_junits_class_name():
    assert pools.node_id("tests.unit.test_pools", "test_x[1]") == "tests/unit/test_pools.py::test_x[1]"
    assert pools.node_id("tests.unit.test_pools.TestA", "test_y") == "tests/unit/test_pools.py::TestA::test_y"
    assert pools.node_id("elsewhere.mod", "test_z") == "elsewhere.mod::test_z"


def test_a_marker_expression_among_pytests_arguments_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        pools.main(["--", "-m", "integration"])
    assert info.value.code == 2 and "use --select" in capsys.readouterr().err


def test_the_machines_busy_share_is_read_from_the_kernels_cpu_line(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal: 3 busy, 1 idle, 1 iowait (in seconds)
    stat.write_text("cpu  %d 0 %d %d %d 0 0 0 0 0\ncpu0 ...\n" % (2 * ticks, ticks, ticks, ticks))
    before = pools.cpu_times(str(stat))
    assert before == (3.0, 5.0)
    stat.write_text("cpu  %d 0 %d %d %d 0 0 0 0 0\n" % (5 * ticks, 2 * ticks, 5 * ticks, ticks))
    assert pools.busy_line(before, pools.cpu_times(str(stat))) == (
        "the machine's CPUs were busy 50 % of the run (4 CPU-s of 8)")
    assert pools.cpu_times(str(tmp_path / "none")) is None and pools.busy_line(None, before) == ""


def test_the_timeline_says_when_each_test_ran_and_what_ran_last(tmp_path):
    """tests/conftest.py's --timeline in a real pytest (its own hook, copied in as the
    root conftest), read back by tools/timeline.py: the slow test is named as the tail."""
    import timeline

    folder = tmp_path / "tests"
    folder.mkdir()
    with open(os.path.join(REPO, "tests", "conftest.py")) as f:
        hooks = f.read().split("# -- the timeline", 1)[1]
    (folder / "conftest.py").write_text(
        "import os\nimport resource\nimport time\n\nimport pytest\n\n# -- the timeline" + hooks)
    (folder / "test_some.py").write_text(  # in file order: the slow one last, for the tail
        "import subprocess, sys, time\n\n"
        "def test_busy():  # a child's CPU counts: a flow's is its processes'\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.3: pass'])\n\n"
        "def test_quick():\n    pass\n\ndef test_slow():\n    time.sleep(0.5)\n")
    out = tmp_path / "timeline" / "cpu-bound"
    out.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(folder), "--timeline", str(out)],
                          cwd=str(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = timeline.read(str(tmp_path / "timeline"))
    assert sorted(r.test.split("::")[1] for r in runs) == ["test_busy", "test_quick", "test_slow"]
    assert {(r.pool, r.worker) for r in runs} == {("cpu-bound", "main")}
    cpu = {r.test.split("::")[1]: r.cpu for r in runs}
    assert cpu["test_busy"] >= 0.3 and cpu["test_slow"] < 0.2, cpu
    lines = timeline.report(runs, tail=0.2, longest=3)
    assert lines[1].startswith("cpu-bound: 3 tests, 1 workers"), lines
    assert lines[2].startswith("workers running a test") and lines[3].split()[0] == "0", lines
    tail = lines.index(next(line for line in lines if line.startswith("running in the last")))
    longest = lines.index("the 3 longest:")
    assert lines[tail + 1:longest] == [], lines  # the slow test's half second is under the tail's second
    assert lines[longest + 3].endswith("tests/test_some.py::test_quick"), lines  # busy and slow: a loaded machine's
    assert lines[longest + 4].startswith("CPU: ") and lines[longest + 5].endswith("  tests/test_some.py"), lines
    busy = timeline.busy_workers([timeline.Ran("p", "w", 0.0, 15.0, "a"), timeline.Ran("p", "v", 0.0, 30.0, "b")],
                                 0.0, 60.0, ["p"])
    assert busy[1:] == ["      0 s   1.5", "     30 s   0.0"], busy
    assert timeline.parse("p", "w", "1.0\t2.0\ta\n1.0\tcut\n1.0\t3.0\tb\t0.5") == [
        timeline.Ran("p", "w", 1.0, 2.0, "a"), timeline.Ran("p", "w", 1.0, 3.0, "b", 0.5)]


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_xdists_first_shares_are_the_pending_tests_over_the_workers_left():
    assert markers.shares(10, 3) == [3, 3, 4] and sum(markers.shares(4510, 3)) == 4510
    assert markers.shares(2, 4) == [0, 0, 1, 1]


def test_each_share_starts_with_its_part_of_the_long_files_kept_whole_and_ends_with_short_tests():
    flows = [_Item("tests/integration/test_a.py::t%d" % i) for i in range(4)]  # 4 s: a second each
    hosts = [_Item("tests/multihost/test_b.py::t%d" % i) for i in range(3)]  # 61 s
    other = [_Item("tests/integration/test_c.py::t0")]  # 1 s
    units = [_Item("tests/unit/test_u.py::t%d" % i) for i in range(12)]
    slow_unit = [_Item("tests/unit/test_v.py::t0")]  # 9 s: long anywhere
    seconds = {"tests/multihost/test_b.py::t0": 60.0, "tests/unit/test_v.py::t0": 9.0}
    items = units[:6] + flows + hosts + other + slow_unit + units[6:]
    order = markers.dealt(items, 3, seconds)
    assert sorted(order, key=id) == sorted(items, key=id)  # every test once
    sizes = markers.shares(len(items), 3)  # 7, 7, 7
    first, second, third = order[:sizes[0]], order[sizes[0]:sizes[0] + sizes[1]], order[sizes[0] + sizes[1]:]
    assert first[:3] == hosts and second[:1] == slow_unit and third[:4] == flows  # longest to the lightest share
    assert third[4:5] == other  # to the share with the fewest seconds so far: 4 against 9 and 61
    assert all(i in units for share in (first[3:], second[1:], third[5:]) for i in share)
    assert markers.dealt(units, 3, {}) == units  # no long files: file order kept


def test_the_durations_are_read_from_json_and_a_bad_file_deals_as_if_none(tmp_path):
    good = tmp_path / "d.json"
    good.write_text('{"tests/x.py::t": 2.5}')
    assert markers.read_durations(str(good)) == {"tests/x.py::t": 2.5}
    for text in ("not json", "[1, 2]", '{"a": "b"}'):
        good.write_text(text)
        assert markers.read_durations(str(good)) == {}
    assert markers.read_durations(str(tmp_path / "none.json")) == {}
    assert markers.read_durations()  # the suite's own, kept in git


def test_a_collection_of_the_suite_imports_no_torch():
    """``warm_bytecode`` compiles a fresh venv's torch beside the collection, apart only while no
    test file imports torch as it is collected (in its tests, its fixtures: not at its top)."""
    code = ("import sys, pytest\n"
            "pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests'])\n"
            "print('TORCH', sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    seen = [line for line in proc.stdout.splitlines() if line.startswith("TORCH ")]
    assert seen == ["TORCH []"], (seen, proc.stdout[-2000:], proc.stderr[-2000:])
