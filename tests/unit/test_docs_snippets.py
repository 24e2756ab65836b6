"""The Python the docs give a reader runs as written (tests/docs_snippets.py):
each ```python block of README.md and docs/*.md is run on CPU in a fresh
interpreter, in an empty folder with its own Metaflow datastore, or says in the
page why not (shown as the skip's reason); every import a page gives, in a
block or inline, is imported."""

from __future__ import annotations

import os
import subprocess
import sys

import extras
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import docs_snippets  # noqa: E402

SNIPPETS = docs_snippets.snippets()


def _python(code: str, cwd: str) -> subprocess.CompletedProcess:
    """``code`` as a file of its own (Metaflow reads a flow's source), run in ``cwd``, with
    what the pages tell a reader to install: metaflow-checkpoint too (docs/resume.md; extras.py)."""
    with open(os.path.join(cwd, "snippet.py"), "w", encoding="utf-8") as f:
        f.write(code)
    env = extras.with_checkpoint(dict(os.environ, METAFLOW_DATASTORE_SYSROOT_LOCAL=cwd,
                                      METAFLOW_USER=os.environ.get("METAFLOW_USER", "docs")))
    return subprocess.run([sys.executable, "snippet.py"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.name for s in SNIPPETS])
def test_a_docs_python_block_runs_as_written(snippet, tmp_path):
    if snippet.example:
        pytest.skip("%s: the file itself (tests/docs_examples.py); its own test runs it" % snippet.example)
    if snippet.reason:
        pytest.skip("not run: %s" % snippet.reason)
    ran = _python(snippet.code, str(tmp_path))
    assert ran.returncode == 0, "%s, as written in the page, fails:\n%s\n(mark it `<!-- not run: why -->` " \
        "on the line before the block if it cannot run on CPU by itself)" % (snippet.name, ran.stderr[-3000:])


def test_every_import_the_docs_give_works(tmp_path):
    """`runtime.node_history.history(...)` named a module no user could import:
    every import statement of a block (run or not) and every inline one is tried."""
    given = sorted({(s.page, line) for s in SNIPPETS for line in docs_snippets.imports(s.code)}
                   | set(docs_snippets.inline_imports()))
    assert any("metaflow_extensions.torchrun.history" in line for _, line in given)
    code = "import sys\nfailed = []\n" + "".join(
        "try:\n    %s\nexcept Exception as e:\n    failed.append(%r + ': ' + repr(e))\n" % (line, "%s: %s" % (page, line))
        for page, line in given) + "print('\\n'.join(failed))\nsys.exit(1 if failed else 0)\n"
    ran = _python(code, str(tmp_path))
    assert ran.returncode == 0, "imports in the docs that fail as written:\n%s%s" % (ran.stdout, ran.stderr[-2000:])


def test_a_snippet_that_does_not_run_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nfrom metaflow_extensions.torchrun.runtime.node_history import nothing\n"
                    "```\n\n<!-- not run: a fragment -->\n```python\n@torchrun\n```\n\n- a list\n\n"
                    "    ```python\n    import os\n    ```\n")
    found = docs_snippets.snippets([str(page)])
    assert [(s.reason, s.code) for s in found] == [
        (None, "from metaflow_extensions.torchrun.runtime.node_history import nothing\n"),
        ("a fragment", "@torchrun\n"), (None, "import os\n")]
    assert _python(found[0].code, str(tmp_path)).returncode != 0
    assert docs_snippets.imports(found[1].code) == [] and docs_snippets.imports(found[2].code) == ["import os"]
