"""Every docs page in a real browser (issue 41): headless Chromium photographs each
built page and measures each SVG picture's text as it really draws
(tools/docs_screenshots.py). Skipped, saying so, where Chromium is not installed;
.ci/run installs it where it can (root, apt-get)."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "tools", "pictures"))
import chromium  # noqa: E402
import docs_screenshots  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(chromium.find() is None, reason="no Chromium on PATH (Debian: apt-get install -y chromium)"),
]


def test_every_page_is_photographed_and_no_picture_text_is_cut(tmp_path):
    site, out = str(tmp_path / "site"), str(tmp_path / "shots")
    assert docs_screenshots.main(site, out) == 0  # 1: Chromium draws an SVG's text past its edge
    pages = docs_screenshots.pages(site)
    shots = sorted(os.listdir(out))
    assert len(pages) >= 15 and len(shots) == len(pages)
    assert all(os.path.getsize(os.path.join(out, s)) > 10_000 for s in shots)  # a page was drawn, not a blank


def test_chromium_finds_the_cut_caption_of_the_old_picture(tmp_path):
    cut = tmp_path / "cut.svg"
    cut.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="30" font-size="12">'
                   '<text x="8" y="20">a caption far longer than the picture it is drawn in</text></svg>')
    with chromium.Browser() as browser:
        (problem,) = docs_screenshots.svg_overflows(browser, str(cut))
    assert "a caption far longer" in problem
