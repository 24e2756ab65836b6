"""Every page of the built docs photographed in headless Chromium, and every SVG
picture's text measured there: what a reader's browser really draws, where the
tests' HTML checks (tests/docs_render.py) can only estimate.

    python tools/docs_screenshots.py [SITE_DIR] [OUT_DIR]

SITE_DIR is built first when absent (default build/site); screenshots go to
OUT_DIR (default build/screenshots, out of git), one PNG per page, 1280 px wide,
the first 2,400 px of it. Prints each SVG text that Chromium draws past its
picture's edge and exits 1 if there is one. Needs Chromium (Debian: apt-get
install -y chromium); tests/integration/test_docs_screenshots.py runs it.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import tempfile
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "pictures"))
sys.path.insert(0, os.path.join(REPO, "tests"))
import chromium  # noqa: E402
import docs_render  # noqa: E402

SKIP = ("404.html",)
# Each text's box, as the browser lays it out, into the page's DOM, read once the scripts ran.
MEASURE = """<script>
var boxes = [];
document.querySelectorAll('svg').forEach(function (svg) {
  var width = svg.viewBox.baseVal && svg.viewBox.baseVal.width || svg.width.baseVal.value;
  svg.querySelectorAll('text').forEach(function (t) {
    var b = t.getBBox();
    boxes.push({text: t.textContent, left: b.x, right: b.x + b.width, width: width});
  });
});
document.body.setAttribute('data-boxes', JSON.stringify(boxes));
</script>"""


def pages(site: str) -> List[str]:
    found = []
    for folder, _, files in os.walk(site):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), site)
            if name.endswith(".html") and rel not in SKIP and not rel.startswith(("assets", "search")):
                found.append(rel)
    return sorted(found)


def shoot(browser: chromium.Browser, site: str, out: str, rel: str) -> str:
    name = "home" if rel == "index.html" else os.path.dirname(rel).replace(os.sep, "-")
    png = os.path.join(out, name + ".png")
    browser.screenshot("file://" + os.path.join(os.path.abspath(site), rel), png)
    return png


def svg_overflows(browser: chromium.Browser, svg_path: str) -> List[str]:
    """Text that Chromium draws past the picture's edge, each a line."""
    with open(svg_path, encoding="utf-8") as f:
        svg = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "measure.html")
        with open(page, "w", encoding="utf-8") as f:
            f.write("<html><body>%s%s</body></html>" % (svg, MEASURE))
        dom = browser.dom_after_scripts("file://" + page)
    found = re.search(r'data-boxes="([^"]*)"', dom)
    if found is None:
        return ["%s: Chromium did not measure it" % svg_path]
    return ["%s: %r is drawn from %.0f to %.0f px of %.0f" % (svg_path, b["text"][:40], b["left"], b["right"], b["width"])
            for b in json.loads(html.unescape(found.group(1)))
            if b["left"] < 0 or b["right"] > b["width"]]


def main(site: str, out: str) -> int:
    if not os.path.isdir(site):
        docs_render.build_site(site)
    os.makedirs(out, exist_ok=True)
    svgs = [os.path.join(REPO, "docs", n) for n in sorted(os.listdir(os.path.join(REPO, "docs"))) if n.endswith(".svg")]
    with chromium.Browser() as browser:  # one for every page: a Chromium each cost about 1.6 CPU-s
        shots = [shoot(browser, site, out, rel) for rel in pages(site)]
        print("%d screenshots in %s" % (len(shots), out))
        problems = [line for svg in svgs for line in svg_overflows(browser, svg)]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0] if args else os.path.join(REPO, "build", "site"),
                  args[1] if len(args) > 1 else os.path.join(REPO, "build", "screenshots")))
