"""The gang's handshake: the pure proofs (gang_auth) and the service and its
clients holding to them over real sockets."""

from __future__ import annotations

import threading
import time

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from gang_net import GUARD, SECRET, read_line, node_report
from metaflow_extensions.torchrun.plugins.torchrun.gang import auth
from metaflow_extensions.torchrun.plugins.torchrun.gang import wire
from metaflow_extensions.torchrun.plugins.torchrun.gang import messages
from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from proc_helpers import wait_until

GANG = "flow-1-train-2-0"
OTHER = b"o" * 32


def a_hello(node=1, secret=SECRET, gang=GANG, server_nonce=b"n" * 32, client_nonce=b"c" * 32):
    return auth.hello(secret, gang, server_nonce, node, host="h", pid=7, client_nonce=client_nonce).to_wire()


class TestProofs:
    def test_a_hello_that_proves_the_secret_is_accepted(self):
        node, nonce = auth.check_hello(SECRET, GANG, b"n" * 32, a_hello(), num_nodes=2)
        assert (node, nonce) == (1, b"c" * 32)

    @pytest.mark.parametrize("change", [
        dict(secret=OTHER), dict(gang="flow-1-train-2-1"), dict(server_nonce=b"m" * 32),
    ])
    def test_a_hello_for_another_secret_gang_or_connection_fails(self, change):
        with pytest.raises(auth.AuthError):
            auth.check_hello(SECRET, GANG, b"n" * 32, a_hello(**change), num_nodes=2)

    @pytest.mark.parametrize("field, value", [
        ("node_index", 0), ("nonce", ("d" * 64)), ("proof", "0" * 64), ("proof", None), ("proof", 3),
        ("proof", "zz"), ("nonce", "00"), ("nonce", "x" * 64), ("nonce", None), ("node_index", True),
        ("node_index", 1.0), ("node_index", "1"), ("node_index", 1e400), ("protocol", messages.PROTOCOL - 1),
        ("type", "welcome"),
    ])
    def test_a_tampered_hello_fails(self, field, value):
        message = a_hello()
        message[field] = value
        with pytest.raises(auth.AuthError):
            auth.check_hello(SECRET, GANG, b"n" * 32, message, num_nodes=2)

    def test_the_node_index_is_checked_after_the_proof(self):
        """Out of range with a good proof says so; with a bad proof the peer
        only ever learns 'wrong proof'."""
        with pytest.raises(auth.AuthError, match="out of range"):
            auth.check_hello(SECRET, GANG, b"n" * 32, a_hello(node=5), num_nodes=2)
        with pytest.raises(auth.AuthError, match="wrong proof"):
            auth.check_hello(SECRET, GANG, b"n" * 32, a_hello(node=5, secret=OTHER), num_nodes=2)

    def test_the_services_proof_cannot_pass_for_a_nodes_and_back(self):
        s_nonce, c_nonce = b"n" * 32, b"c" * 32
        reflected = a_hello()
        reflected["proof"] = auth.proof(SECRET, "server", GANG, s_nonce, c_nonce, 1)
        with pytest.raises(auth.AuthError):
            auth.check_hello(SECRET, GANG, s_nonce, reflected, num_nodes=2)
        fake_welcome = {"type": "welcome", "proof": a_hello()["proof"]}
        with pytest.raises(auth.AuthError):
            auth.check_welcome(SECRET, GANG, s_nonce, c_nonce, 1, fake_welcome)

    def test_a_welcome_proves_the_service(self):
        w = auth.welcome(SECRET, GANG, b"n" * 32, b"c" * 32, 1, cause=None)
        auth.check_welcome(SECRET, GANG, b"n" * 32, b"c" * 32, 1, w)
        for secret, node in ((OTHER, 1), (SECRET, 0)):
            with pytest.raises(auth.AuthError):
                auth.check_welcome(secret, GANG, b"n" * 32, b"c" * 32, node, w)

    def test_a_reject_is_no_welcome_and_its_reason_is_cut(self):
        with pytest.raises(auth.AuthError, match="rejected: node 1 is taken"):
            auth.check_welcome(SECRET, GANG, b"n" * 32, b"c" * 32, 1, {"type": "reject", "reason": "node 1 is taken"})
        with pytest.raises(auth.AuthError, match="no reason given"):
            auth.check_welcome(SECRET, GANG, b"n" * 32, b"c" * 32, 1, {"type": "reject", "reason": "r" * 10_000})

    def test_proofs_are_compared_in_constant_time(self, monkeypatch):
        calls = []
        real = auth.hmac.compare_digest
        monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
        auth.check_hello(SECRET, GANG, b"n" * 32, a_hello(), num_nodes=2)
        auth.check_payload(SECRET, GANG, 0, 1, b"x", auth.payload_proof(SECRET, GANG, 0, 1, b"x"))
        assert len(calls) == 2

    def test_the_challenge_says_nothing_about_the_gang(self):
        c = auth.challenge(b"n" * 32).to_wire()
        assert set(c) == {"type", "protocol", "nonce"}
        assert auth.read_challenge(c) == b"n" * 32

    @pytest.mark.parametrize("message", [
        {}, {"type": "challenge", "protocol": messages.PROTOCOL}, {"type": "challenge", "protocol": 2, "nonce": "00" * 32},
        {"type": "hello", "protocol": messages.PROTOCOL, "nonce": "00" * 32},
        {"type": "challenge", "protocol": messages.PROTOCOL, "nonce": "0" * 63},
    ])
    def test_what_is_not_a_challenge(self, message):
        with pytest.raises(auth.AuthError):
            auth.read_challenge(message)

    def test_nonces_are_fresh(self):
        assert len({auth.new_nonce() for _ in range(100)}) == 100

    def test_the_payload_proof_binds_gang_call_node_and_bytes(self):
        good = auth.payload_proof(SECRET, GANG, 2, 1, b"bytes")
        assert auth.check_payload(SECRET, GANG, 2, 1, b"bytes", good)
        for args in ((OTHER, GANG, 2, 1, b"bytes"), (SECRET, "g2", 2, 1, b"bytes"), (SECRET, GANG, 3, 1, b"bytes"),
                     (SECRET, GANG, 2, 0, b"bytes"), (SECRET, GANG, 2, 1, b"bytez")):
            assert not auth.check_payload(*args, good)
        assert not auth.check_payload(SECRET, GANG, 2, 1, b"bytes", None)

    def test_keys_are_one_per_purpose(self):
        assert auth.derive(SECRET, "handshake") != auth.derive(SECRET, "rank0")
        # a handshake proof is never a payload proof for the same fields
        assert auth.proof(SECRET, "client", GANG, b"", b"", 1) != auth.payload_proof(SECRET, GANG, 0, 1, b"")

    def test_fields_cannot_slide_into_each_other(self):
        assert auth.payload_proof(SECRET, "g1", 23, 4, b"") != auth.payload_proof(SECRET, "g12", 3, 4, b"")

    @pytest.mark.parametrize("secret", [None, "s" * 32, b"", b"short", 12345])
    def test_weak_or_wrong_secrets_are_refused(self, secret):
        with pytest.raises(ValueError):
            auth.check_secret(secret)


class TestHandshakeOverSockets:
    def test_the_wrong_secret_learns_nothing_and_changes_nothing(self, net):
        said = []
        server = net.server(2, hooks={"warn": said.append})
        (c0,) = net.join(server, [0])
        seen = b""
        for _ in range(3):
            raw = net.raw(server.port)
            challenge = raw.read_challenge()
            reply = raw.hello(server.config, 1, secret=OTHER)
            seen += wire.encode(challenge) + wire.encode(reply)
            assert reply == {"type": "reject", "reason": "not authenticated"}
        assert server.config.gang_id.encode() not in seen
        assert server.admission.rejected == 3 and len(said) == 1 and "did not prove" in said[0]
        assert server.missing() == [1] and server.cause is None and c0.cause is None

    def test_a_hello_replayed_on_another_connection_fails(self, net):
        server = net.server(2)
        first = net.raw(server.port)
        hello = auth.hello(SECRET, server.config.gang_id, bytes.fromhex(first.read_challenge()["nonce"]), 1).to_wire()
        second = net.raw(server.port)
        second.read_challenge()
        second.send(hello)
        assert read_line(second.sock)["type"] == "reject"
        first.send(hello)  # on its own connection it is good
        assert read_line(first.sock)["type"] == "welcome"

    def test_a_client_believes_no_service_that_cannot_prove_the_secret(self, net):
        """A fake service greets properly, then welcomes with a made-up proof and
        a fake cause: the client passes over it, and keeps no cause."""
        listener = net.listener()
        listener.settimeout(0.1)
        stop = threading.Event()

        def impostor():
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                net.socks.append(conn)
                conn.sendall(wire.encode(auth.challenge(auth.new_nonce()).to_wire()))
                read_line(conn)
                conn.sendall(wire.encode({"type": "welcome", "proof": "0" * 64,
                                          "cause": Cause(CauseKind.RANK_FAILED, "FAKE").to_wire()}))

        t = threading.Thread(target=impostor, daemon=True)
        t.start()
        try:
            ours = net.server(2)
            c1 = net.client(ours.config, [listener.getsockname()[1], ours.port], 1)
            assert c1.cause is None and c1.port == ours.port
            alone = net.client(ours.config, [listener.getsockname()[1]], 0, give_up_after=0.5)
            assert alone.cause.kind is CauseKind.CONTROL_UNREACHABLE
            assert "FAKE" not in alone.cause.summary and "does not hold this gang's secret" in alone.cause.summary
        finally:
            stop.set()
            t.join(GUARD)

    def test_a_secret_from_a_function_is_got_while_joining(self, net):
        server = net.server(2)
        got = []

        def slow_secret():
            time.sleep(0.3)
            got.append(1)
            return SECRET

        c = net.client(server.config, server.port, 1, connect=False, secret=slow_secret)
        c.start()
        assert got == []  # start() returned before the secret was there
        assert c.wait_joined() and got == [1]

    def test_no_secret_no_join_and_the_reason_is_told(self, net):
        server = net.server(2)

        def unpublished():
            raise TimeoutError("the control task did not publish the gang's secret")

        c = net.client(server.config, server.port, 1, secret=unpublished)
        assert c.wait_joined() is False
        assert c.cause.kind is CauseKind.CONTROL_UNREACHABLE
        assert "could not get the gang's secret: TimeoutError" in c.cause.summary
        assert server.missing() == [0, 1]

    def test_members_get_the_long_line_limit_strangers_the_short_one(self, net):
        server = net.server(2)
        (c0,) = net.join(server, [0])
        stranger = net.raw(server.port)
        stranger.read_challenge()
        stranger.sock.sendall(b'{"type": "hello", "pad": "' + b"x" * wire.PRE_AUTH_LINE)
        assert read_line(stranger.sock) == {}  # dropped before the line even ended
        report = node_report(*range(12), tail_chars=1000)  # 480 KB: a member may
        c0.report_failure(Cause(CauseKind.RANK_FAILED, "big report"), report=report)
        assert wait_until(lambda: server.cause is not None, GUARD)
        assert server.cause.summary == "big report"
