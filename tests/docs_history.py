"""What makes a page read as a lab notebook instead of documentation: a commit's hash,
an "issue N", a date in prose. History belongs in CHANGELOG.md, measurements with their
commits in docs/benchmarks.md; every other page says what is true now.

A commit is a token of 7 to 40 hex digits (a letter and a digit among them) that git
resolves to a commit of this repository; outside a git checkout, every such token counts
but a card's ``--hash`` (the card hashes pasted consoles show). A date counts in prose
only: a pasted console block keeps its timestamps.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Callable, Iterable, List, Optional, Set

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The pages allowed to name commits, issues and dates: the history and the measurements.
EXEMPT = {"CHANGELOG.md", os.path.join("docs", "benchmarks.md")}

_HEX = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?!\w)")
_CARD_HASH = re.compile(r"--hash\s+$")
_ISSUE = re.compile(r"\bissues?[\s#-]*\d+", re.I)
_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
          r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?")
_DATE = re.compile(r"\b(?:20\d\d-\d\d-\d\d|{m} \d{{1,2}}\b|\d{{1,2}} {m}(?!\w)|{m} 20\d\d)".format(m=_MONTH))
_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)


def pages() -> List[str]:
    """Every page a user reads: docs/*.md, the README and the benchmarks' method, the exempt ones left out."""
    docs = os.path.join(REPO, "docs")
    found = [os.path.join("docs", n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    found += ["README.md", os.path.join("benchmarks", "README.md")]
    return [p for p in found if p not in EXEMPT]


def git_commits(tokens: Iterable[str], repo: str = REPO) -> Optional[Set[str]]:
    """The tokens that name a commit of ``repo``; None where git cannot say (no checkout)."""
    tokens = sorted(set(tokens))
    try:
        subprocess.run(["git", "-C", repo, "rev-parse", "--git-dir"], check=True, capture_output=True)
        out = subprocess.run(["git", "-C", repo, "cat-file", "--batch-check"], check=True, capture_output=True,
                             text=True, input="".join(t + "^{commit}\n" for t in tokens)).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {t for t, line in zip(tokens, out) if line.split()[1:2] == ["commit"]}


def hashes(text: str, is_commit: Callable[[List[str]], Optional[Set[str]]] = git_commits) -> List[str]:
    tokens = [m.group(0) for m in _HEX.finditer(text)]
    commits = is_commit(tokens)
    if commits is not None:
        return [t for t in tokens if t in commits]
    return [m.group(0) for m in _HEX.finditer(text) if not _CARD_HASH.search(text[:m.start()][-20:])]


def problems(text: str, is_commit: Callable[[List[str]], Optional[Set[str]]] = git_commits) -> List[str]:
    """What in one page's text reads as a notebook, each as ``kind: what``."""
    prose = _FENCE.sub("", text)
    return (["commit: %s" % h for h in hashes(text, is_commit)]
            + ["issue: %s" % m.group(0) for m in _ISSUE.finditer(text)]
            + ["date: %s" % m.group(0) for m in _DATE.finditer(prose)])
