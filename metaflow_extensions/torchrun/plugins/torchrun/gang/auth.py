"""Who may speak on the gang's channel: a mutual HMAC challenge-response
(``challenge``, then the peer's ``hello`` or ``probe``, then the service's ``welcome`` or a
``reject`` that says nothing about the gang; docs/design.md, "Who may speak").

Fresh nonces make a recorded proof worthless on another connection; the gang
id inside the MAC keeps two gangs that share a secret apart; ``derive`` makes
one key per purpose, so a proof of one kind never passes for another.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any, Mapping, Optional, Tuple, Type, TypeVar, Union

from ..base.knobs import MIN_SECRET_BYTES
from ..cause import Cause
from . import messages as msg
from .wire import ProtocolError


class AuthError(ValueError):
    """The other side does not hold the gang's secret (or is no gang service)."""


def check_secret(secret: Any) -> bytes:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError("a gang secret is bytes, at least %d of them" % MIN_SECRET_BYTES)
    return bytes(secret)


def derive(secret: bytes, purpose: str) -> bytes:
    return hmac.new(secret, b"metaflow-torchrun gang v1\0" + purpose.encode(), hashlib.sha256).digest()


def _frame(*parts: bytes) -> bytes:
    """Length-prefixed: no two different field lists give the same bytes."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _mac(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, _frame(*parts), hashlib.sha256).hexdigest()


def _same(expected: str, given: Any) -> bool:
    return isinstance(given, str) and len(given) == msg.PROOF_HEX and hmac.compare_digest(expected, given)


def new_nonce() -> bytes:
    return secrets.token_bytes(msg.NONCE_BYTES)


def proof(secret: bytes, side: str, gang_id: str, server_nonce: bytes, client_nonce: bytes, node: int) -> str:
    return _mac(derive(secret, "handshake"), side.encode(), gang_id.encode(), server_nonce, client_nonce,
                str(node).encode())


def _read(message: Union[Mapping[str, Any], msg.GangMessage], expected: Type[msg.M], why: str) -> msg.M:
    """A wrong type or field is an ``AuthError``: the peer is no gang node or service of ours."""
    if isinstance(message, expected):
        return message
    if not isinstance(message, Mapping):
        raise AuthError(why)
    try:
        return msg.parse_as(message, expected)
    except ProtocolError:
        raise AuthError(why) from None


def challenge(server_nonce: bytes) -> msg.Challenge:
    return msg.Challenge(nonce=server_nonce)


def read_challenge(message: Union[Mapping[str, Any], msg.Challenge]) -> bytes:
    challenge = _read(message, msg.Challenge, "not a gang service (or another version of it)")
    if challenge.protocol != msg.PROTOCOL:
        raise AuthError("not a gang service (or another version of it)")
    return challenge.nonce


def hello(secret: bytes, gang_id: str, server_nonce: bytes, node: int, host: str = "?", pid: int = 0,
          client_nonce: Optional[bytes] = None) -> msg.Hello:
    client_nonce = client_nonce or new_nonce()
    return msg.Hello(node_index=node, nonce=client_nonce, host=host[:255], pid=pid,
                     proof=proof(secret, "client", gang_id, server_nonce, client_nonce, node))


def check_hello(secret: bytes, gang_id: str, server_nonce: bytes, message: Union[Mapping[str, Any], msg.Hello],
                num_nodes: int) -> Tuple[int, bytes]:
    """The proof is checked whatever the index: a stranger learns nothing from which indexes fail how."""
    return _check_proved(secret, gang_id, server_nonce, message, msg.Hello, "client", num_nodes)


def probe(secret: bytes, gang_id: str, server_nonce: bytes, node: int, client_nonce: bytes) -> msg.Probe:
    return msg.Probe(node_index=node, nonce=client_nonce,
                     proof=proof(secret, "probe", gang_id, server_nonce, client_nonce, node))


def check_probe(secret: bytes, gang_id: str, server_nonce: bytes, message: Union[Mapping[str, Any], msg.Probe],
                num_nodes: int) -> Tuple[int, bytes]:
    return _check_proved(secret, gang_id, server_nonce, message, msg.Probe, "probe", num_nodes)


P = TypeVar("P", msg.Hello, msg.Probe)


def _check_proved(secret: bytes, gang_id: str, server_nonce: bytes, message: Union[Mapping[str, Any], P],
                  kind: Type[P], side: str, num_nodes: int) -> Tuple[int, bytes]:
    if isinstance(message, Mapping):
        node = message.get("node_index")
        if isinstance(node, bool) or not isinstance(node, int) or not -1 < node < msg.MAX_NODE:
            raise AuthError("no node index")
    why = "not a %s of this protocol" % kind.TYPE.value
    got = _read(message, kind, why)
    if got.protocol != msg.PROTOCOL:
        raise AuthError(why)
    expected = proof(secret, side, gang_id, server_nonce, got.nonce, got.node_index)
    if not _same(expected, got.proof):
        raise AuthError("wrong proof")
    if got.node_index >= num_nodes:
        raise AuthError("node index out of range")
    return got.node_index, got.nonce


def welcome(secret: bytes, gang_id: str, server_nonce: bytes, client_nonce: bytes, node: int,
            cause: Optional[Cause] = None) -> msg.Welcome:
    return msg.Welcome(proof=proof(secret, "server", gang_id, server_nonce, client_nonce, node), cause=cause)


def check_welcome(secret: bytes, gang_id: str, server_nonce: bytes, client_nonce: bytes, node: int,
                  message: Union[Mapping[str, Any], msg.GangMessage]) -> msg.Welcome:
    kind = message.TYPE.value if isinstance(message, msg.GangMessage) else message.get("type")
    if kind == msg.MessageType.REJECT.value:
        reject = _read(message, msg.Reject, "rejected")
        raise AuthError("rejected: %s" % reject.reason)
    got = _read(message, msg.Welcome, "the service does not hold this gang's secret")
    expected = proof(secret, "server", gang_id, server_nonce, client_nonce, node)
    if not _same(expected, got.proof):
        raise AuthError("the service does not hold this gang's secret")
    return got


def payload_proof(secret: bytes, gang_id: str, call: int, node: int, data: bytes) -> str:
    """Rank 0's return value, bound to this gang, call and node: it is unpickled only after this checks out."""
    return _mac(derive(secret, "rank0"), gang_id.encode(), str(call).encode(), str(node).encode(), data)


def check_payload(secret: bytes, gang_id: str, call: int, node: int, data: bytes, given: Any) -> bool:
    return _same(payload_proof(secret, gang_id, call, node, data), given)
