"""secret.py against a real Metaflow local datastore in a temporary directory."""

from __future__ import annotations

import os
import stat
import threading
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest
from metaflow.datastore import FlowDataStore
from metaflow.plugins.datastores.local_storage import LocalStorage

from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import SECRET_ENV, read_knobs
from metaflow_extensions.torchrun.plugins.torchrun.gang import secret as sec
from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity

ID = GangIdentity(flow_name="TrainFlow", run_id="17", step_name="train", control_task_id="4", attempt=0)


@pytest.fixture
def storage(tmp_path):
    return FlowDataStore("TrainFlow", storage_impl=LocalStorage, ds_root=str(tmp_path / ".metaflow"))._storage_impl


def test_a_secret_is_random_and_long():
    a, b = sec.make_secret(), sec.make_secret()
    assert a != b and len(a) == 32


def test_published_by_the_control_fetched_by_a_worker(storage):
    secret = sec.control_secret(storage, ID, None)[0]
    assert sec.for_worker(storage, ID, None, timeout=1) == secret
    assert sec.fetch(storage, ID, timeout=0) == secret


def test_the_file_is_the_users_alone_and_next_to_the_control_task(storage):
    sec.publish(storage, ID, b"k" * 32)
    path = storage.full_uri(sec.secret_path(ID))
    assert path.endswith("TrainFlow/17/train/4/torchrun-gang-secret.0")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path, "rb") as f:
        assert b"k" * 32 not in f.read()  # stored as hex, with a header: never as raw bytes


def test_every_attempt_has_its_own(storage):
    sec.publish(storage, ID, b"a" * 32)
    retry = GangIdentity(**{**ID.__dict__, "attempt": 1})
    assert sec.load(storage, retry) is None
    sec.publish(storage, retry, b"b" * 32)
    assert (sec.load(storage, ID), sec.load(storage, retry)) == (b"a" * 32, b"b" * 32)


def test_a_worker_that_starts_first_waits_for_the_control(storage):
    later = threading.Timer(0.6, sec.publish, args=(storage, ID, b"w" * 32))
    later.start()
    try:
        t0 = time.monotonic()
        assert sec.fetch(storage, ID, timeout=5, poll=0.05) == b"w" * 32
        assert 0.5 < time.monotonic() - t0 < 5
    finally:
        later.cancel()


def test_a_worker_gives_up_at_its_deadline_naming_the_path(storage):
    t0 = time.monotonic()
    with pytest.raises(sec.SecretUnavailable, match="TrainFlow/17/train/4/torchrun-gang-secret.0 within 0.3s"):
        sec.fetch(storage, ID, timeout=0.3, poll=0.05)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("content", [b"", b"garbage", sec._PREFIX + b"zz\n", sec._PREFIX + b"abcd\n"])
def test_a_file_that_is_not_a_secret_is_not_taken(storage, content):
    import io

    storage.save_bytes(iter([(sec.secret_path(ID), io.BytesIO(content))]), overwrite=True)
    assert sec.load(storage, ID) is None
    with pytest.raises(sec.SecretUnavailable):
        sec.fetch(storage, ID, timeout=0.1, poll=0.05)


def test_datastore_errors_are_retried_until_the_deadline():
    class Flaky:
        TYPE = "s3"
        calls = 0

        def load_bytes(self, keys):
            Flaky.calls += 1
            raise OSError("503 Slow Down")

    with pytest.raises(sec.SecretUnavailable, match="503 Slow Down"):
        sec.fetch(Flaky(), ID, timeout=0.2, poll=0.05)
    assert Flaky.calls >= 2


def test_the_users_own_secret_wins_and_nothing_is_stored(storage):
    own, refused = read_knobs({SECRET_ENV: "my own secret, long enough"})
    assert not refused and own.secret == b"my own secret, long enough"
    assert sec.control_secret(storage, ID, own.secret)[0] == b"my own secret, long enough"
    assert sec.for_worker(storage, ID, own.secret, timeout=0) == b"my own secret, long enough"
    assert sec.load(storage, ID) is None


def test_a_short_users_secret_is_an_error_not_a_fallback():
    own, refused = read_knobs({SECRET_ENV: "short"})
    assert own.secret is None and len(refused) == 1 and "shorter than 16 bytes" in refused[0]


# -- withdrawn when the control's step ends (issue 29) ------------------------------


def test_withdrawn_once_from_the_local_datastore(storage):
    secret, published = sec.control_secret(storage, ID, None)
    path = storage.full_uri(sec.secret_path(ID))
    assert os.path.exists(path) and sec.fetch(storage, ID, timeout=0) == secret
    published.withdraw()
    published.withdraw()  # the second path to get there finds nothing to do
    assert not os.path.exists(path)


def test_a_users_own_secret_leaves_nothing_to_withdraw(storage, tmp_path):
    _, published = sec.control_secret(storage, ID, b"my own secret, long enough")
    published.withdraw()
    assert not os.path.exists(storage.full_uri(sec.secret_path(ID)))


class NoDelete(LocalStorage):
    """A datastore without a local file to remove, as S3 is to Metaflow."""

    TYPE = "s3-like"


def test_elsewhere_it_is_overwritten_and_a_late_worker_is_told_at_once(tmp_path):
    storage = FlowDataStore("TrainFlow", storage_impl=NoDelete, ds_root=str(tmp_path / ".metaflow"))._storage_impl
    _, published = sec.control_secret(storage, ID, None)
    published.withdraw()
    assert sec.WITHDRAWN in open(storage.full_uri(sec.secret_path(ID)), "rb").read()
    started = time.monotonic()
    with pytest.raises(sec.SecretUnavailable, match="already ended"):
        sec.fetch(storage, ID, timeout=30)
    assert time.monotonic() - started < 5


# -- the control's word that its step ended fine (gang/step_end.py) --------------------


def test_a_late_node_reads_that_the_step_ended_fine_beside_the_secret(storage):
    from metaflow_extensions.torchrun.plugins.torchrun.gang.step_end import StepEnd, step_end_path

    end, other_attempt = StepEnd(storage, ID), StepEnd(storage, GangIdentity(**dict(vars(ID), attempt=1)))
    assert not end.ended()  # the step runs: a late node joins the gang as any node does
    end.ended_fine()
    assert end.ended() and not other_attempt.ended()
    assert os.path.dirname(step_end_path(ID)) == os.path.dirname(sec.secret_path(ID))
    assert not StepEnd(None, ID).ended()  # a local run: no task starts after its step
