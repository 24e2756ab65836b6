"""A skip for want of the machine (root, namespaces, iproute2, Chromium...) is a failure, with its
reason, where ``MFTR_REQUIRE_MACHINE=1`` (CI); elsewhere it stays a skip, as does any other skip
(tests/conftest.py). Run in a pytest of its own, with the suite's hook."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The suite's conftest by path (``conftest`` here is tests/unit's).
_spec = importlib.util.spec_from_file_location("suite_conftest", os.path.join(TESTS, "conftest.py"))
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)
REQUIRE_MACHINE, machine_skip_failure = suite.REQUIRE_MACHINE, suite.machine_skip_failure

SKIPS = textwrap.dedent("""
    import pytest

    @pytest.mark.skipif(True, reason="namespaces of its own take root and unshare(1)")
    def test_marked():
        pass

    def test_chromium():
        pytest.skip("no Chromium on PATH (Debian: apt-get install -y chromium)")

    def test_other():
        pytest.skip("not a git clone")

    @pytest.mark.xfail(reason="needs root, expected to fail")
    def test_xfail():
        assert False
""")
# The suite's hook, loaded by path: the folder's own conftest is this one.
HOOK = textwrap.dedent("""
    import importlib.util
    spec = importlib.util.spec_from_file_location("suite_conftest", %r)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    pytest_runtest_makereport = suite.pytest_runtest_makereport
""" % os.path.join(TESTS, "conftest.py"))


def _run(tmp_path, required: bool) -> str:
    (tmp_path / "conftest.py").write_text(HOOK)
    (tmp_path / "test_skips.py").write_text(SKIPS)
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_MACHINE}
    if required:
        env[REQUIRE_MACHINE] = "1"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_skips.py")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


def test_in_ci_a_skip_for_want_of_the_machine_fails_with_its_reason(tmp_path):
    out = _run(tmp_path, required=True)
    # A skipif mark's skip comes at set-up: an error there; pytest.skip in the test: a failure.
    assert "1 failed, 1 skipped, 1 xfailed" in out and "1 error" in out, out
    assert "skipped for want of the machine, where MFTR_REQUIRE_MACHINE=1 requires it: namespaces of its own take " \
           "root and unshare(1)" in out, out
    assert "ERROR test_skips.py::test_marked" in out and "FAILED test_skips.py::test_chromium" in out, out
    assert "SKIPPED [1] test_skips.py:12: not a git clone" in out and "XFAIL test_skips.py::test_xfail" in out, out


def test_elsewhere_it_is_skipped_saying_why(tmp_path):
    out = _run(tmp_path, required=False)
    assert "3 skipped, 1 xfailed" in out and "namespaces of its own take root" in out, out


@pytest.mark.parametrize("reason", [
    "multi-host tests need network namespaces: `ip` is not installed (iproute2 / util-linux)",
    "no tc here", "cannot mount a tmpfs here", "not root: cannot make a second user to attack our files with",
    "listening as another user takes root", "no Chromium (apt-get install -y chromium)",
])
def test_the_suites_reasons_are_read_as_the_machines(reason):
    assert machine_skip_failure(reason, {REQUIRE_MACHINE: "1"}) is not None
    assert machine_skip_failure(reason, {}) is None


@pytest.mark.parametrize("reason", ["not a git clone", "--pin needs 2 or more cores", "not run: a step of a flow",
                                    "this Metaflow registers no card metadata", "torch is not installed: ..."])
def test_other_skips_stay_skips(reason):
    assert machine_skip_failure(reason, {REQUIRE_MACHINE: "1"}) is None
