"""The gang's secret: made by the control, shared through the run's datastore.

Why the datastore: it is the one place every node of a run can already read
and write with the run's own credentials (the local datastore for local runs,
the flow's S3 datastore on Kubernetes and AWS Batch), and whoever can read it
can read the run's artifacts anyway, so it adds no one to the circle of trust.
The network between the nodes is not trusted with it: it never crosses the
gang's port (``auth`` proves knowledge of it without sending it).

One secret per gang (one attempt of one ``@torchrun`` step of one run): a
retry is a new gang with a new secret. It lives next to the control task's own
files: ``<flow>/<run>/<step>/<control task>/torchrun-gang-secret.<attempt>``,
0600 on a local datastore. Users who manage their own secret set
``METAFLOW_TORCHRUN_SECRET`` on every node instead; then nothing is stored.

Workers may start before the control (on Kubernetes they often do): ``fetch``
polls until its deadline.
"""

from __future__ import annotations

import io
import os
import secrets
import time
from typing import Any, Callable, Optional, Protocol, Tuple

from .auth import MIN_SECRET_BYTES
from .identity import GangIdentity

from ..base import timeouts
SECRET_BYTES = 32
_PREFIX = b"metaflow-torchrun gang secret v1\n"


class SecretUnavailable(TimeoutError):
    """The control did not publish the gang's secret in time."""


class Storage(Protocol):
    """What ``secret.py`` needs of a Metaflow ``DataStoreStorage``
    (``flow_datastore._storage_impl``, ``task_datastore._storage_impl``)."""

    TYPE: str

    def save_bytes(self, path_and_bytes_iter, overwrite=False, len_hint=0): ...

    def load_bytes(self, keys): ...

    def full_uri(self, path): ...


def make_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def secret_path(identity: GangIdentity) -> str:
    return "/".join((identity.flow_name, identity.run_id, identity.step_name, identity.control_task_id,
                     "torchrun-gang-secret.%d" % identity.attempt))


def encode(secret: bytes) -> bytes:
    return _PREFIX + secret.hex().encode() + b"\n"


def decode(data: bytes) -> Optional[bytes]:
    """The secret in a stored file, or None when the file is not one (yet)."""
    if not data.startswith(_PREFIX):
        return None
    try:
        secret = bytes.fromhex(data[len(_PREFIX):].strip().decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return secret if len(secret) >= MIN_SECRET_BYTES else None


def publish(storage: Storage, identity: GangIdentity, secret: bytes) -> str:
    """The control stores the gang's secret; returns where."""
    path = secret_path(identity)
    storage.save_bytes(iter([(path, io.BytesIO(encode(secret)))]), overwrite=True)
    if getattr(storage, "TYPE", None) == "local":
        # Metaflow's local storage writes through mkstemp (0600) and a rename:
        # make sure of it, whatever a future version does.
        os.chmod(storage.full_uri(path), 0o600)
    return path


# What a withdrawn secret's file holds where the storage cannot delete (S3 and the
# other datastores have no delete in Metaflow's storage API): not a secret.
WITHDRAWN = b"metaflow-torchrun gang secret withdrawn\n"


def withdraw(storage: Storage, identity: GangIdentity) -> None:
    """The control's step is over: the attempt's secret is of no more use, so it
    does not stay readable beside the run's artifacts. The local datastore's file
    is removed; elsewhere it is overwritten with a marker that ``decode`` refuses.
    Never raises: the step's outcome is already decided."""
    path = secret_path(identity)
    try:
        if getattr(storage, "TYPE", None) == "local":
            try:
                os.unlink(storage.full_uri(path))
            except FileNotFoundError:
                pass
        else:
            storage.save_bytes(iter([(path, io.BytesIO(WITHDRAWN))]), overwrite=True)
    except Exception:  # a datastore error: the secret dies with the attempt anyway
        pass


def load(storage: Storage, identity: GangIdentity) -> Optional[bytes]:
    """The stored secret, or None when it is not there (yet)."""
    with storage.load_bytes([secret_path(identity)]) as loaded:
        for _, local_path, _ in loaded:
            if local_path is None:
                return None
            with open(local_path, "rb") as f:
                data = f.read(4096)
            if data == WITHDRAWN:
                raise SecretUnavailable("the control task's step has already ended (its gang's secret at %s is "
                                        "withdrawn): this node started too late to join it" % secret_path(identity))
            return decode(data)
    return None


def fetch(
    storage: Storage,
    identity: GangIdentity,
    timeout: float,
    poll: float = timeouts.SECRET_POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    """A worker waits for the control to publish, until ``timeout``."""
    deadline = clock() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            secret = load(storage, identity)
        except SecretUnavailable:
            raise
        except Exception as e:  # a transient datastore error: try again
            secret, last_error = None, e
        if secret is not None:
            return secret
        if clock() >= deadline:
            raise SecretUnavailable(
                "the control task did not publish the gang's secret at %s within %gs (or its step had "
                "already ended)%s"
                % (secret_path(identity), timeout, " (last error: %s)" % last_error if last_error else ""))
        sleep(poll)


def for_control(storage: Storage, identity: GangIdentity, own: Optional[bytes]) -> bytes:
    """The control's secret: the user's own (``Knobs.secret``), or a new one, published."""
    return control_secret(storage, identity, own)[0]


def control_secret(storage: Storage, identity: GangIdentity, own: Optional[bytes]) -> Tuple[bytes, "Published"]:
    """``for_control``, with what withdraws the published secret when the step ends."""
    if own is not None:
        return own, Published(None)
    secret = make_secret()
    publish(storage, identity, secret)
    return secret, Published((storage, identity))


class Published:
    """The control's published secret (None: nothing was), withdrawn once,
    whichever way the step ends (the step's own ``finally``, ``task_finished``,
    a local control's failure path): the first to get there does it."""

    def __init__(self, where: Optional[Tuple[Storage, GangIdentity]]):
        self._where = where

    def withdraw(self) -> None:
        where, self._where = self._where, None
        if where is not None:
            withdraw(*where)


def for_task(storage: Storage, identity: GangIdentity, own: Optional[bytes], is_control: bool,
             timeout: float) -> Tuple[Any, "Published"]:
    """The control publishes the gang's secret before Metaflow spawns the local
    nodes, so that they find it at once; the others fetch it while joining
    (the first element is then a callable). The second withdraws it."""
    if is_control:
        return control_secret(storage, identity, own)
    return (lambda: for_worker(storage, identity, own, timeout)), Published(None)


def for_worker(storage: Storage, identity: GangIdentity, own: Optional[bytes], timeout: float) -> bytes:
    if own is not None:
        return own
    return fetch(storage, identity, timeout)
