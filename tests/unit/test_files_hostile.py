"""What another user of the host can put in our way: a planted return value, a
shared TMPDIR without the sticky bit."""

from __future__ import annotations

import os
import pickle

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host import basedir, private
from metaflow_extensions.torchrun.plugins.torchrun.procs import functions


class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _status(directory, rank):
    with open(os.path.join(directory, "rank-%d.status.json" % rank), "w") as f:
        f.write("{}")


def test_only_the_ranks_that_ran_here_are_read(tmp_path):
    marker = str(tmp_path / "ran")
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    for rank in (2, 3):
        _status(str(work), rank)
        functions.write_pickle(functions.result_path(str(work), rank), rank * 10)
    (work / "rank-99.return.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    assert functions.read_returns(str(work)) == {2: 20, 3: 30}
    assert functions.read_returns(str(work), ranks=[3]) == {3: 30}
    assert not os.path.exists(marker)


def test_return_files_are_private(tmp_path):
    functions.write_pickle(str(tmp_path / "rank-0.return.pkl"), 1)
    assert os.stat(tmp_path / "rank-0.return.pkl").st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_a_return_file_others_may_write_is_not_loaded(tmp_path, mode):
    marker = str(tmp_path / "ran")
    path = tmp_path / "rank-0.return.pkl"
    path.write_bytes(pickle.dumps(_Planted(marker)))
    os.chmod(path, mode)
    _status(str(tmp_path), 0)
    with pytest.raises(PermissionError, match="not a private regular file"):
        functions.read_returns(str(tmp_path))
    assert not os.path.exists(marker)


def test_a_symlinked_return_file_is_not_followed(tmp_path):
    marker = str(tmp_path / "ran")
    target = tmp_path / "elsewhere.pkl"
    target.write_bytes(pickle.dumps(_Planted(marker)))
    os.symlink(target, tmp_path / "rank-0.return.pkl")
    _status(str(tmp_path), 0)
    with pytest.raises(OSError):
        functions.read_returns(str(tmp_path))
    assert not os.path.exists(marker)


def test_a_world_writable_tmpdir_without_sticky_bit_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(private.UnsafePath, match="sticky bit"):
        basedir.base_dir(str(shared))
    os.chmod(shared, 0o1777)  # as /tmp: fine
    assert basedir.base_dir(str(shared)).startswith(str(shared))
