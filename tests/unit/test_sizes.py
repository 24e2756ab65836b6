"""Issue 23: no function over about 60 lines and no class over about 250 without
a reason written beside it (``# size: ...``; tools/sizes.py, also in make lint)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import sizes  # noqa: E402


def test_every_long_function_or_class_says_why():
    unexplained = [where for where, _kind, _length, why in sizes.report() if not why]
    assert unexplained == []


def test_the_check_sees_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join("    x = %d" % i for i in range(70))
    (package / "m.py").write_text("def long():\n%s\n\n\n# size: generated\ndef fine():\n%s\n" % (body, body))
    found = {where.split()[-1]: why for where, _k, _n, why in sizes.report(str(package))}
    assert found == {"long": "", "fine": "generated"}
