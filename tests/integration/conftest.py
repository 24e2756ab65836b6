import pytest

from .helpers import Gang, describe


@pytest.fixture
def gang(tmp_path):
    """A sandbox for one test; fails the test if any of its processes survive."""
    g = Gang(tmp_path)
    try:
        yield g
    finally:
        leaked = g.leaks()
        g.kill_everything()
    assert not leaked, "processes left behind:\n" + describe(leaked)
