"""The package a new user installs: its version, its license metadata, the demo's
requirements, and the older metaflow-torchrun 0.2 named when it is installed beside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from metaflow_extensions.torchrun.toplevel import conflicts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _setup(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "setup.py", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout


def _requirements(name: str) -> dict:
    pins = {}
    with open(os.path.join(REPO, name)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-r"):
                package, _, version = line.partition("==")
                pins[package.split("[")[0].lower()] = version
    return pins


def test_the_version_sorts_after_0_2_on_pypi():
    version = _setup("--version").strip().splitlines()[-1]
    numbers = tuple(int(n) for n in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())
    assert numbers > (0, 2, 2), version


def test_the_license_is_an_spdx_expression_without_a_license_classifier():
    # A License classifier beside the license field makes setuptools 77+ print
    # "License classifiers are deprecated" on every build.
    assert not [c for c in _setup("--classifiers").splitlines() if c.startswith("License ::")]
    assert _setup("--license").strip().splitlines()[-1] == "Apache-2.0"


def test_the_demo_installs_the_runtime_only_pinned():
    demo = _requirements("requirements-demo.txt")
    assert set(demo) == {"metaflow", "torch", "numpy", "setproctitle"}  # setproctitle: host/title.py
    assert all(re.fullmatch(r"\d+(\.\d+)*", v) for v in demo.values()), demo
    with open(os.path.join(REPO, "requirements-dev.txt")) as f:
        assert "-r requirements-demo.txt" in f.read().splitlines()
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    assert re.search(r"^demo: demo-install$", makefile, re.M)
    assert '$(INSTALL) $(VENV) "setuptools>=68" -r requirements-demo.txt' in makefile


_EXTRAS = """
import json, sys, setuptools
seen = {}
setuptools.setup = lambda **kw: seen.update(kw)
sys.argv = ["setup.py"]
exec(compile(open("setup.py").read(), "setup.py", "exec"), {"__name__": "__main__", "__file__": "setup.py"})
print(json.dumps(seen["extras_require"]))
"""


def test_the_hf_extra_installs_what_hfs_trainer_needs_at_the_tested_versions():
    """The README promises HF's Trainer with no code, and the demo's venv had no transformers: the `hf`
    extra installs it, pinned where the tests' venv pins it (requirements-hf.txt, which requirements-dev.txt
    includes), and the README says how."""
    import json

    hf = _requirements("requirements-hf.txt")
    assert {"transformers", "accelerate"} <= set(hf) and all(re.fullmatch(r"\d+(\.\d+)*", v) for v in hf.values())
    with open(os.path.join(REPO, "requirements-dev.txt")) as f:
        dev = f.read().splitlines()
    assert "-r requirements-hf.txt" in dev and not [line for line in dev if line.startswith("transformers")]
    out = subprocess.run([sys.executable, "-c", _EXTRAS], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    extras = json.loads(out.strip().splitlines()[-1])
    assert sorted(extras["hf"]) == sorted("%s==%s" % kv for kv in hf.items()), extras
    with open(os.path.join(REPO, "MANIFEST.in")) as f:
        assert "include requirements-hf.txt" in f.read().splitlines()  # the sdist builds the wheel
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    assert 'pip install -e ".[hf]"' in readme
    assert "transformers" not in _requirements("requirements-demo.txt")  # the demo stays the runtime only


def test_metaflow_checkpoint_is_installed_apart_pinned_and_loaded_only_where_asked():
    """Metaflow loads every installed extension in every process it starts: in the venv's
    site-packages, metaflow-checkpoint cost 0.02-0.04 CPU-s in each of the suite's ~800 Metaflow
    processes (tests/extras.py)."""
    import extras

    assert "metaflow-checkpoint" not in _requirements("requirements-dev.txt")
    assert _requirements("requirements-checkpoint.txt") == {"metaflow-checkpoint": "0.2.14"}
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    assert "$(INSTALL) $(VENV) --no-deps --target $(CHECKPOINT_SITE) -r requirements-checkpoint.txt" in makefile
    assert extras.has_checkpoint(), extras.NO_CHECKPOINT
    loaded = "import metaflow, sys; print(any(m.startswith('metaflow_extensions.obcheckpoint') for m in sys.modules))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for where, expected in ((env, "False"), (extras.with_checkpoint(env), "True")):
        out = subprocess.run([sys.executable, "-c", loaded], env=where, cwd="/", capture_output=True, text=True,
                             timeout=60)
        assert out.stdout.strip() == expected, out.stderr[-2000:]


def _fake_02(root) -> str:
    plugins = root / "metaflow_extensions" / "torchrun" / "plugins"
    (plugins / "torchrun_libs").mkdir(parents=True)
    (plugins / "__init__.py").write_text("")
    (plugins / "torchrun_decorator.py").write_text("")
    (root / "metaflow_torchrun-0.2.2.dist-info").mkdir()
    return str(root)


def test_0_2_is_found_by_its_files_and_its_metadata(tmp_path):
    site = _fake_02(tmp_path / "site")
    only_metadata = tmp_path / "meta"
    (only_metadata / "metaflow_torchrun-0.2.1.dist-info").mkdir(parents=True)
    ours = tmp_path / "ours"
    (ours / "metaflow_torchrun-0.3.0.dev0.dist-info").mkdir(parents=True)
    (ours / "metaflow_torchrun-0.1.0.dist-info").mkdir()
    found = conflicts.find_02_installs([site, str(only_metadata), str(ours), "", "/nonexistent"])
    assert found == [(site, "0.2.2"), (str(only_metadata), "0.2.1")]


def test_import_metaflow_names_an_installed_0_2(tmp_path):
    site = _fake_02(tmp_path)
    env = dict(os.environ, PYTHONPATH=site)
    out = subprocess.run(
        [sys.executable, "-c", "import metaflow"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "metaflow-torchrun 0.2.2 in %s" % site in last
    assert "pip uninstall metaflow-torchrun" in last
    clean = subprocess.run(
        [sys.executable, "-c", "from metaflow import torchrun"], capture_output=True, text=True, timeout=120
    )
    assert clean.returncode == 0, clean.stderr
