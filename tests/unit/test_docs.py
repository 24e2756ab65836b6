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


def test_every_card_command_the_docs_show_as_printed_names_its_card(tmp_path):
    """The control prints `card view <task> --id torchrun --hash <hash>`: a
    pasted log whose card line has no hash is from before one card per attempt
    (docs/failures.md had two)."""
    assert docs_quotes.card_commands_without_hash() == []
    old = "2026-11-25 06:54:41.008 [1/train/2 (pid 1653)] The card: python flow.py card view 1/train/2 --id torchrun"
    new = "@torchrun: this step's card: python flow.py card view 1/train/2 --id torchrun --hash 3e7111c1"
    pasted = tmp_path / "page.md"
    pasted.write_text(old + "\n" + new + "\n")
    assert [line for _, line in docs_quotes.card_commands_without_hash([str(pasted)])] == [old]


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


# -- issue 41: the docs read whole unbuilt, and every relative link lands -------------------

import docs_examples  # noqa: E402

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)=["']([^"']+)["']""")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc (mkdocs) makes it; GitHub's is the
    same for the headings these pages have (checked by the test below)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "")  # code and emphasis marks (never `_`: names keep theirs)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        explicit = re.search(r"\{\s*#([\w-]+)[^}]*\}\s*$", heading)
        found.add(explicit.group(1) if explicit else slug(heading))
    found.update(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", text))
    return found


def links(path: str) -> list:
    """The relative links and anchors of a Markdown file, code blocks left out."""
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code
    targets = LINK.findall(text) + HTML_LINK.findall(text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, mailto:, ...


def broken_links(path: str) -> list:
    problems = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(where):
            problems.append("%s: %s does not exist" % (os.path.relpath(path, REPO), target))
        elif anchor and where.endswith(".md") and anchor not in anchors(where):
            problems.append("%s: %s has no heading #%s" % (os.path.relpath(path, REPO), file_part or "the page", anchor))
    return problems


def test_every_relative_link_and_anchor_in_the_docs_and_the_readme_lands():
    assert [p for page in docs_examples.pages() for p in broken_links(page)] == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "b.md").write_text("# Where every rank was: stacks, hangs and preemption\n\n## `torchrun_args`\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#where-every-rank-was-stacks-hangs-and-preemption) [ok](b.md#torchrun_args) "
                    "[gone](c.md) [no](b.md#nowhere) [web](https://example.com/x.md) `[code](d.md)`\n"
                    "```\n[in a block](e.md)\n```\n")
    assert broken_links(str(page)) == ["%s: c.md does not exist" % os.path.relpath(str(page), REPO),
                                       "%s: b.md has no heading #nowhere" % os.path.relpath(str(page), REPO)]


def test_pasted_examples_equal_their_files_and_no_page_is_only_an_include_line():
    found = []
    for page in docs_examples.pages():
        with open(page, encoding="utf-8") as f:
            text = f.read()
        assert "--8<--" not in text, "%s: an include line reads as itself unbuilt: paste the code" % page
        for rel, code in docs_examples.pasted(text):
            found.append(rel)
            assert code == docs_examples.source(rel), (
                "%s: the copy of %s differs from the file: python tests/docs_examples.py --write" % (page, rel))
    assert {"examples/hello/flow.py", "examples/hello/hello.py", "examples/function/flow.py",
            "examples/kubernetes/flow.py", "examples/batch/flow.py"} <= set(found)


def test_the_docs_build_from_the_docs_extra_alone():
    with open(os.path.join(REPO, "requirements-docs.txt")) as f:
        pins = [l.split("#", 1)[0].strip() for l in f if l.split("#", 1)[0].strip()]
    assert pins and all("==" in p for p in pins)
    assert not any(p.startswith(("metaflow", "torch")) for p in pins)
    with open(os.path.join(REPO, "requirements-dev.txt")) as f:
        assert "-r requirements-docs.txt" in f.read().splitlines()
    with open(os.path.join(REPO, "setup.py")) as f:
        assert '"docs": requirements("requirements-docs.txt")' in f.read()
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    assert re.search(r"^docs: docs-install$", makefile, re.M)
    assert "$(DOCS_BIN)/python -m pip install --quiet -r requirements-docs.txt" in makefile
    with open(os.path.join(REPO, ".github", "workflows", "docs.yml")) as f:
        workflow = f.read()
    assert "run: make docs" in workflow and "path: site" in workflow and "actions/deploy-pages" in workflow


def test_the_readme_says_what_ci_adds_to_its_test_command():
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = [l.strip() for l in f if l.strip().startswith("make ")]
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    assert ci == ['make wheel-venv >"$package_log" 2>&1 &', "make install", 'make package-check >>"$package_log" 2>&1 &',
                  'make test PYTEST_ARGS="-ra" || status=$?']
    assert "make test" in readme and "runs `make package-check` beside `make test`" in readme


# -- the docs read as documentation: history in CHANGELOG.md, measurements in docs/benchmarks.md --

import docs_history  # noqa: E402
import pytest  # noqa: E402


@pytest.mark.parametrize("page", docs_history.pages())
def test_a_page_names_no_commit_no_issue_and_no_date_in_prose(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        found = docs_history.problems(f.read())
    assert found == [], "%s reads as a notebook: move history to CHANGELOG.md, measurements to docs/benchmarks.md" % page


def test_the_notebook_check_finds_a_commit_an_issue_and_a_date():
    page = ("The first round (issue 37, at 55e4617) took 3 s on 2026-11-23, and again on Nov 24.\n"
            "```console\n2026-11-26 09:30:07.901 [1/train/2] The card: ... --hash bd4719dc\n```\n"
            "The card's hash `--hash 3e7111c1` and a count of 1795685376665240 are no commit.\n")
    assert docs_history.problems(page) == ["commit: 55e4617", "issue: issue 37", "date: 2026-11-23", "date: Nov 24"]
    clean = "Resume from the last checkpoint: about 1.5 s from the failure to the new ranks (rank 0 may land on any node; it decides.\n3 ranks wait.)\n"
    assert docs_history.problems(clean) == []


def test_without_git_every_hex_token_but_a_card_hash_counts():
    page = "at b7d3e8d, and the card `card view 1/train/2 --hash 3e7111c1`; 1795685376665240 is a run id\n"
    assert docs_history.hashes(page, lambda tokens: None) == ["b7d3e8d"]
