"""Does each built page show what its Markdown source means? Faults that
``mkdocs build --strict`` lets through, found in the HTML it writes:

- a list that did not become one: a paragraph or list item whose text has a line
  starting with a list marker (``- ``, ``* ``, ``1. ``), as when a list follows a
  paragraph without a blank line, or a block in a list item is indented too little;
- Metaflow's own markers (``MF Add To Current``, ``@@``) outside code that talks
  about them, and ``@@`` anywhere (inside code boxes too);
- the API page's parameters as a run-on paragraph rather than one row each;
- SVG text that runs past the picture's edge (estimated from font metrics,
  ``tools/pictures/text_width.py``).

Used by tests/unit/test_docs_render.py; ``python tests/docs_render.py SITE_DIR``
prints what it finds in a built site.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools", "pictures"))
from text_width import text_width  # noqa: E402

LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*(?:[-*+]|\d+[.)])[ \t]+\S")
METAFLOW_MARKERS = re.compile(r"MF\s+Add\s+To\s+Current|@@", re.I)
BLOCKS = ("p", "li", "td", "th", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6")
VOID = {"br", "img", "hr", "input", "meta", "link", "wbr", "source", "col", "area", "base", "embed", "track"}


class _Blocks(HTMLParser):
    """The text of each block element (code left out), and all text with code in."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: List[str] = []
        self.open_blocks: List[Tuple[str, List[str]]] = []
        self.blocks: List[Tuple[str, str]] = []
        self.prose: List[str] = []  # outside <code>/<pre>
        self.all_text: List[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in VOID:
            return
        self.stack.append(tag)
        if tag in BLOCKS:
            self.open_blocks.append((tag, []))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID or tag not in self.stack:
            return
        while self.stack:
            top = self.stack.pop()
            if top in BLOCKS and self.open_blocks:
                name, parts = self.open_blocks.pop()
                self.blocks.append((name, "".join(parts)))
            if top == tag:
                break

    def handle_data(self, data: str) -> None:
        if any(t in ("script", "style") for t in self.stack):
            return
        self.all_text.append(data)
        in_code = any(t in ("code", "pre") for t in self.stack)
        if not in_code:
            self.prose.append(data)
            if self.open_blocks:
                self.open_blocks[-1][1].append(data)
        elif self.open_blocks:
            self.open_blocks[-1][1].append("`code`")


def page_problems(html: str) -> List[str]:
    """What in one built page does not render as its source means."""
    parser = _Blocks()
    parser.feed(html)
    problems = []
    for tag, text in parser.blocks:
        if LIST_MARKER.search(text):
            line = next(l for l in text.splitlines() if LIST_MARKER.search("\n" + l))
            problems.append("a <%s> holds a Markdown list marker: %r" % (tag, line.strip()[:80]))
    marker = METAFLOW_MARKERS.search(" ".join(parser.prose))
    if marker:
        problems.append("Metaflow's marker %r is in the page's text" % marker.group(0))
    if "@@" in "".join(parser.all_text):
        problems.append("a raw '@@' is in the page (a code box included)")
    return problems


def parameter_problems(html: str, names: List[str]) -> List[str]:
    """Each parameter name in a row or item of its own, not in running text."""
    missing = [n for n in names
               if not re.search(r"<(td|li)\b[^>]*>\s*(<[^>]+>\s*)*<code>%s</code>" % re.escape(n), html)]
    return ["parameter %s is not an item of the parameter list" % n for n in missing]


def docstring_parameters(source: str, owner: str) -> List[str]:
    """The names under ``Parameters`` in the numpydoc docstring of class ``owner``."""
    body = source[source.index("class %s" % owner):]
    section = body[body.index("Parameters\n"):]
    section = section[:section.index('"""')]
    section = re.split(r"\n\s*\n\s*[A-Z][A-Za-z ]+\n\s*-{3,}", section)[0]
    return re.findall(r"^    (\w+) : ", section, re.M)


def svg_problems(svg: str) -> List[str]:
    """Text drawn past the left or right edge of the picture."""
    root = ET.fromstring(svg)
    width = _svg_width(root)
    base_size = float(root.get("font-size", "16"))
    sizes = _class_sizes(root)
    problems = []
    for node in root.iter("{http://www.w3.org/2000/svg}text"):
        text = "".join(node.itertext())
        size = float(node.get("font-size") or sizes.get(node.get("class", ""), base_size))
        bold = node.get("font-weight") == "bold" or node.get("class", "") in sizes.get("_bold", ())
        left = float(node.get("x", "0"))
        drawn = text_width(text, size, bold)
        anchor = node.get("text-anchor", "start")
        start = left - (drawn if anchor == "end" else drawn / 2 if anchor == "middle" else 0)
        if start < 0 or start + drawn > width:
            problems.append("text %r runs past the picture's edge (%.0f to %.0f of %.0f px)"
                            % (text[:40], start, start + drawn, width))
    return problems


def _svg_width(root: ET.Element) -> float:
    box = root.get("viewBox")
    if box:
        return float(box.split()[2])
    return float(re.sub(r"px$", "", root.get("width", "0")))


def _class_sizes(root: ET.Element) -> Dict:
    """font-size per class from the picture's <style>, and the bold classes."""
    css = "".join("".join(s.itertext()) for s in root.iter("{http://www.w3.org/2000/svg}style"))
    sizes: Dict = {"_bold": set()}
    for name, body in re.findall(r"\.([\w-]+)\s*\{([^}]*)\}", css):
        size = re.search(r"font-size:\s*([\d.]+)", body)
        if size:
            sizes[name] = float(size.group(1))
        if re.search(r"font-weight:\s*(bold|[6-9]00)", body):
            sizes["_bold"].add(name)
    return sizes


def build_site(dest: str, mkdocs: Optional[str] = None) -> None:
    """``mkdocs build`` of this repository into ``dest``."""
    command = [mkdocs or os.path.join(os.path.dirname(sys.executable), "mkdocs"),
               "build", "--quiet", "--site-dir", dest]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)


def site_problems(site: str) -> Dict[str, List[str]]:
    """Every fault found in a built site, by file."""
    found: Dict[str, List[str]] = {}
    for folder, _, files in os.walk(site):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, site)
            if name.endswith(".html") and not rel.startswith(("search", "assets")) and rel != "404.html":
                with open(path, encoding="utf-8") as f:
                    problems = page_problems(f.read())
            elif name.endswith(".svg") and not rel.startswith("assets"):
                with open(path, encoding="utf-8") as f:
                    problems = svg_problems(f.read())
            else:
                continue
            if problems:
                found[rel] = problems
    return found


if __name__ == "__main__":
    for page, problems in sorted(site_problems(sys.argv[1]).items()):
        for problem in problems:
            print("%s: %s" % (page, problem))
