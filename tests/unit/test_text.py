"""text.py: the one way a text is shortened for a person, and a count with its noun."""

from hypothesis import given
from hypothesis import strategies as st

from metaflow_extensions.torchrun.plugins.torchrun.base.text import count, first_line, shorten

TORCH = "Connection closed by peer [127.0.0.1]:30171. This is typically caused by a remote peer having exited"


def test_a_cut_ends_where_a_word_ends():
    cut = shorten(TORCH, 80)
    assert cut == "Connection closed by peer [127.0.0.1]:30171. This is typically caused by a…"
    assert shorten("exactly", 7) == "exactly" and shorten("", 3) == ""


def test_a_text_without_spaces_is_cut_where_it_must():
    path = "/very/long/path/to/some/where/deep/inside/a/checkpoint/directory/model.pt"
    assert shorten(path, 20) == path[:19] + "…"
    assert shorten("word " + "x" * 50, 20) == "word " + "x" * 14 + "…"  # the space is too far back


def test_punctuation_before_the_cut_is_dropped():
    assert shorten("one, two; three four", 10) == "one, two…"


@given(st.text(), st.integers(min_value=0, max_value=200))
def test_never_longer_than_asked_and_unchanged_when_it_fits(text, limit):
    out = shorten(text, limit)
    assert len(out) <= limit
    assert (out == text) == (len(text) <= limit)
    assert text.startswith(out) or out.endswith("…")


def test_a_count_reads_as_a_person_writes_it():
    assert [count(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert count(1, "index", "indices") == "1 index" and count(3, "index", "indices") == "3 indices"


def test_a_messages_first_line_skips_leading_blank_lines():
    assert first_line("\n\n  boom: it broke\n  at line 2\n") == "boom: it broke"
    assert first_line("") == first_line(None) == ""  # type: ignore[arg-type]
