"""The install recipe a new user follows (README.md, docs/getting-started.md):
one torch version, the tested one, named in one place (launch/torch_checks.py)
and pinned wherever a user is told what to install."""

from __future__ import annotations

import os
import re

from metaflow_extensions.torchrun.plugins.torchrun.launch import torch_checks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def _pins(rel: str) -> dict:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", _read(rel), re.M))


def test_the_demo_requirements_pin_the_tested_torch_and_numpy():
    pins = _pins("requirements-demo.txt")
    assert pins["torch"] == torch_checks.TESTED_TORCH
    assert "numpy" in pins  # else torch warns "Failed to initialize NumPy" at import


def test_the_missing_torch_fix_installs_the_tested_torch():
    assert torch_checks.TORCH_INSTALL_HINT == 'pip install "torch==%s" numpy' % torch_checks.TESTED_TORCH
    quoted = re.findall(r'pip install "torch==([^"]+)"', _read("docs/reference.md") + _read("docs/versions.md"))
    assert quoted and set(quoted) == {torch_checks.TESTED_TORCH}


RECIPE = re.compile(r"^<!-- install recipe: [^\n]*-->\n```bash\n(.*?)^```$", re.M | re.S)


def recipe(rel: str) -> str:
    (found,) = RECIPE.findall(_read(rel))
    return found


def test_the_readme_and_getting_started_give_one_recipe():
    assert recipe("README.md") == recipe("docs/getting-started.md")


def test_the_recipe_installs_the_tested_versions_numpy_included():
    """A user who installed torch without numpy saw torch warn "Failed to
    initialize NumPy": the recipe installs the demo requirements, which pin it."""
    text = recipe("README.md")
    assert "pip install -r requirements-demo.txt" in text and "pip install -e ." in text
    pins = _pins("requirements-demo.txt")
    said = re.search(r"# the tested versions: metaflow (\S+), torch (\S+), numpy\n", text)
    assert said and said.groups() == (pins["metaflow"], torch_checks.TESTED_TORCH), text
    commands = [line.split("#", 1)[0] for line in text.splitlines()]
    assert not any(re.search(r"\btorch\b(?!==)", c) for c in commands if "pip install" in c)  # no unpinned torch


def test_the_recipe_gives_metaflow_a_user_name():
    """A container's first error was Metaflow's "Unknown user": the recipe sets
    METAFLOW_USER, and that line works where USER is not set or is root."""
    import subprocess

    (line,) = [l.split("#", 1)[0].strip() for l in recipe("README.md").splitlines() if "METAFLOW_USER" in l]
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "USERNAME", "METAFLOW_USER", "LOGNAME")}
    said = subprocess.run(["bash", "-c", line + ' && printf %s "$METAFLOW_USER"'], env=env, capture_output=True,
                          text=True, timeout=30)
    assert said.returncode == 0 and said.stdout.strip(), said
    # Metaflow takes root for no name at all (metaflow.util.get_username): a root shell's USER=root.
    as_root = subprocess.run(["bash", "-c", line + ' && printf %s "$METAFLOW_USER"'], env=dict(env, USER="root"),
                             capture_output=True, text=True, timeout=30)
    assert as_root.returncode == 0 and as_root.stdout.strip() not in ("", "root"), as_root
    assert "Unknown user" in _read("README.md") and "Unknown user" in _read("docs/getting-started.md")


def test_what_card_view_leaves_in_an_examples_folder_is_ignored_by_git():
    """`python flow.py card view` writes metaflow_card_cache/ where it runs: a
    user who tried examples/hello saw it untracked in the clone."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not os.path.isdir(os.path.join(REPO, ".git")):
        import pytest

        pytest.skip("not a git clone")
    path = "examples/hello/metaflow_card_cache/HelloTorchrun/runs/1/card.html"
    said = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, timeout=30)
    assert said.returncode == 0, "git does not ignore %s" % path
