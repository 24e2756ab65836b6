"""The gang's secret: made by the control, shared through the run's datastore.

The datastore is the one place every node can already reach with the run's
own credentials, and whoever reads it reads the run's artifacts anyway: it
adds no one to the circle of trust. The secret never crosses the gang's port.
One per attempt, next to the control task's files (0600 on a local
datastore); ``METAFLOW_TORCHRUN_SECRET`` on every node replaces it.
"""

from __future__ import annotations

import io
import os
import secrets
import time
from typing import Any, Callable, Optional, Protocol, Tuple

from ..base.knobs import MIN_SECRET_BYTES
from .identity import GangIdentity
from ..base import timeouts

SECRET_BYTES = 32
_PREFIX = b"metaflow-torchrun gang secret v1\n"


class SecretUnavailable(TimeoutError):
    """The control did not publish the gang's secret in time."""


class Storage(Protocol):
    """What is needed of a Metaflow ``DataStoreStorage`` (``task_datastore._storage_impl``)."""

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
    """None when the file is not one (yet)."""
    if not data.startswith(_PREFIX):
        return None
    try:
        secret = bytes.fromhex(data[len(_PREFIX):].strip().decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return secret if len(secret) >= MIN_SECRET_BYTES else None


def publish(storage: Storage, identity: GangIdentity, secret: bytes) -> None:
    path = secret_path(identity)
    storage.save_bytes(iter([(path, io.BytesIO(encode(secret)))]), overwrite=True)
    if getattr(storage, "TYPE", None) == "local":
        os.chmod(storage.full_uri(path), 0o600)


# What a withdrawn secret's file holds where the storage cannot delete (S3 and the
# other datastores have no delete in Metaflow's storage API): not a secret.
WITHDRAWN = b"metaflow-torchrun gang secret withdrawn\n"


def withdraw(storage: Storage, identity: GangIdentity) -> None:
    """Not left readable beside the run's artifacts. Never raises: the step's outcome is decided."""
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


def fetch(storage: Storage, identity: GangIdentity, timeout: float, poll: float = timeouts.SECRET_POLL,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bytes:
    """Workers may start before the control (on Kubernetes they often do)."""
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


def control_secret(storage: Storage, identity: GangIdentity, own: Optional[bytes]) -> Tuple[bytes, "Published"]:
    """The user's own (``Knobs.secret``), or a new one, published; and what withdraws it."""
    if own is not None:
        return own, Published(None)
    secret = make_secret()
    publish(storage, identity, secret)
    return secret, Published((storage, identity))


class Published:
    """Withdrawn once, by the first of the ways a step ends to get there."""

    def __init__(self, where: Optional[Tuple[Storage, GangIdentity]]):
        self._where = where

    def withdraw(self) -> None:
        where, self._where = self._where, None
        if where is not None:
            withdraw(*where)


def for_task(storage: Storage, identity: GangIdentity, own: Optional[bytes], is_control: bool,
             timeout: float) -> Tuple[Any, "Published"]:
    """The control publishes before Metaflow spawns the local nodes; the others fetch it while joining."""
    if is_control:
        return control_secret(storage, identity, own)
    return (lambda: for_worker(storage, identity, own, timeout)), Published(None)


def for_worker(storage: Storage, identity: GangIdentity, own: Optional[bytes], timeout: float) -> bytes:
    return own if own is not None else fetch(storage, identity, timeout)
