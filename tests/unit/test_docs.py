"""The docs' own checks that need no flow: the README's example is the example file,
quotes are found and a changed message is caught, PyPI's long description has no
relative link."""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import docs_quotes  # noqa: E402

REPO = docs_quotes.REPO


def test_the_readme_example_is_examples_hello_and_the_readme_is_short():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(REPO, "examples", "hello", "flow.py")) as f:
        example = f.read()
    assert "```python\n%s```" % example in readme
    assert len(readme.splitlines()) <= 150


def test_a_changed_message_is_caught():
    quotes = [("docs/x.md", "@torchrun: all 2 nodes are there"),
              ("docs/x.md", "node 1 ended its step after 0 calls of current.torch.run while node 0 waits in call 1")]
    said = ("2026-11-23 13:14:13.482 [1/train/2 (pid 7)] @torchrun: all 3 nodes are there\n"
            "node 1 ended its step after 0 calls of current.torch.run while node 0 waits in call 1: every node...\n")
    assert docs_quotes.unmatched(quotes, said) == []
    drifted = said.replace("nodes are there", "nodes joined after 31 s")
    assert docs_quotes.unmatched(quotes, drifted) == [quotes[0]]


def test_the_docs_quotes_are_found():
    pages = docs_quotes.by_page(docs_quotes.quoted_messages())
    assert any(q.startswith("@torchrun: this step's card") for q in pages["docs/getting-started.md"])


def test_the_long_description_has_no_relative_link():
    sys.path.insert(0, REPO)
    import importlib.util

    spec = importlib.util.spec_from_file_location("_setup_for_pypi", os.path.join(REPO, "setup.py"))
    with open(os.path.join(REPO, "setup.py")) as f:
        source = f.read()
    namespace: dict = {"re": re}
    exec(source[source.index("def for_pypi"):source.index("with open(")], namespace)
    del spec
    with open(os.path.join(REPO, "README.md")) as f:
        described = namespace["for_pypi"](f.read())
    assert not re.search(r"\]\((?!https?://)", described)
    assert "![" not in described
