"""The built site shows what its Markdown means (issue 41): checked in the HTML
that ``mkdocs build`` writes (tests/docs_render.py), and the checker itself
catches each fault it was written for."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import docs_render  # noqa: E402

REPO = docs_render.REPO
DECORATOR = os.path.join(REPO, "metaflow_extensions", "torchrun", "plugins", "torchrun", "decorator.py")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("site"))
    docs_render.build_site(dest)
    return dest


def test_every_page_and_picture_renders_as_its_source_means(site):
    assert docs_render.site_problems(site) == {}


def test_the_api_page_lists_every_torchrun_parameter_as_an_item(site):
    with open(DECORATOR) as f:
        names = docs_render.docstring_parameters(f.read(), "TorchrunDecorator")
    assert "heartbeat_timeout" in names and "retry_on" in names and len(names) >= 10
    with open(os.path.join(site, "api", "index.html")) as f:
        assert docs_render.parameter_problems(f.read(), names) == []


@pytest.mark.parametrize("html, found", [
    # a list right after a paragraph, no blank line between (docs/resume.md)
    ("<p>for three reasons:\n- A Python exception\n- A wrong refusal</p>", "list marker"),
    # a list item's paragraph indented too little: the next items run on (docs/seeing-the-gang.md)
    ("<ul><li>a</li></ul><pre><code>x</code></pre><p>On the control task\n- <strong>Join</strong> progress</p>",
     "list marker"),
    ("<li>It shows:\n  - the topology</li>", "list marker"),
    ('<h3 id="mf-add-to-current">MF Add To Current</h3>', "marker"),
    ("<pre><code>@@ Returns\n-------\nTorchrunHandle</code></pre>", "'@@'"),
])
def test_the_checker_finds_each_fault(html, found):
    assert any(found in p for p in docs_render.page_problems(html))


def test_the_checker_passes_what_is_right():
    assert docs_render.page_problems(
        "<p>a - b, 3. c</p><ul><li>one</li></ul><p>the <code>MF Add To Current</code> section</p>"
        "<pre><code>- a list in code\n1. is code</code></pre>") == []


def test_a_run_on_parameter_paragraph_is_found():
    run_on = "<p>Parameters\n----------\n<code>port</code> : int</p>"
    table = "<table><tr><td><code>port</code></td><td>int</td></tr></table>"
    assert docs_render.parameter_problems(run_on, ["port"]) and not docs_render.parameter_problems(table, ["port"])


def test_svg_text_past_the_edge_is_found():
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="300" height="40" font-size="13">'
           "<style>.note{font-size:12px}</style>"
           '<text x="8" y="20" class="note">%s</text></svg>')
    assert docs_render.svg_problems(svg % "fits") == []
    assert "runs past the picture's edge" in docs_render.svg_problems(svg % ("word " * 20))[0]
