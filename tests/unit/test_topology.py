"""topology.py: ports and who this node is."""

from __future__ import annotations

import collections
import socket
import types

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.gang import ports
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import PORT_ENV as LOCAL_PORT_ENV
from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import (
    PORT_RANGE,
    CANDIDATE_PORTS,
    choose_ports,
    find_free_port,
    hashed_port,
    parse_port,
)
from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import Topology, is_local_runtime, topology_from

Parallel = collections.namedtuple("Parallel", "main_ip num_nodes node_index")


class TestParsePort:
    @pytest.mark.parametrize("value", [None, "None", "none", "NONE", "", "  ", " None "])
    def test_no_port(self, value):
        assert parse_port(value, "SRC") is None

    @pytest.mark.parametrize(
        "value, port",
        [("29500", 29500), (29500, 29500), (" 8080 ", 8080), ("1", 1), ("65535", 65535)],
    )
    def test_valid(self, value, port):
        assert parse_port(value, "SRC") == port

    @pytest.mark.parametrize(
        "value", ["abc", "0", "70000", "65536", "-1", "29500.0", "2950O", 0, 70000, "1e4"]
    )
    def test_invalid_raises_naming_source_and_value(self, value):
        with pytest.raises(TorchrunInvalidArgument) as e:
            parse_port(value, "MY_SOURCE")
        msg = str(e.value)
        assert "MY_SOURCE" in msg
        assert repr(value) in msg


class TestChoosePort:
    def test_configured_wins_over_everything(self):
        env = {LOCAL_PORT_ENV: "21000", "MF_MASTER_PORT": "22000"}
        assert choose_ports(env, "gang", configured=23000) == (23000,)

    def test_the_setting_is_not_read_here(self):
        """METAFLOW_TORCHRUN_PORT is read at the step's start (knobs.py) and comes as ``configured``."""
        env = {LOCAL_PORT_ENV: "21000", "MF_MASTER_PORT": "22000"}
        assert choose_ports(env, "gang") == (22000,)

    def test_mf_master_port_next(self):
        assert choose_ports({"MF_MASTER_PORT": "22000"}, "gang") == (22000,)

    def test_hashed_last(self):
        ports = choose_ports({}, "gang-key")
        assert len(ports) == CANDIDATE_PORTS == len(set(ports))
        assert ports[0] == hashed_port("gang-key#0")
        assert ports == choose_ports({}, "gang-key")  # every node computes the same list
        assert ports != choose_ports({}, "other-gang")

    @pytest.mark.parametrize("none", ["None", "", "none"])
    def test_mf_master_port_none_falls_through(self, none):
        assert choose_ports({"MF_MASTER_PORT": none}, "k") == choose_ports({}, "k")

    def test_configured_even_when_env_is_garbage(self):
        assert choose_ports({LOCAL_PORT_ENV: "junk", "MF_MASTER_PORT": "junk"}, "k", 25000) == (25000,)

    @pytest.mark.parametrize("var", ["MF_MASTER_PORT"])
    def test_garbage_env_raises_naming_variable(self, var):
        with pytest.raises(TorchrunInvalidArgument) as e:
            choose_ports({var: "http"}, "k")
        assert var in str(e.value)

    def test_does_not_read_os_environ(self, monkeypatch):
        monkeypatch.setenv(LOCAL_PORT_ENV, "21000")
        monkeypatch.setenv("MF_MASTER_PORT", "22000")
        assert 21000 not in choose_ports({}, "k") and 22000 not in choose_ports({}, "k")


class TestHashedPort:
    def test_deterministic(self):
        assert hashed_port("Flow-1-train-2-0") == hashed_port("Flow-1-train-2-0")

    def test_known_value_is_stable_across_processes(self):
        # sha256-based, not hash(): the same in every node's interpreter
        import hashlib

        key = "Flow-1-train-2-0"
        low, high = PORT_RANGE
        expected = low + int(hashlib.sha256(key.encode()).hexdigest(), 16) % (high - low + 1)
        assert hashed_port(key) == expected

    def test_in_range(self):
        low, high = PORT_RANGE
        ports = [hashed_port("gang-%d" % i) for i in range(3000)]
        assert all(low <= p <= high for p in ports)
        assert high < 32768  # below the ephemeral range
        # spread out, so two gangs rarely collide
        assert len(set(ports)) > 2500

    def test_attempts_get_different_ports(self):
        assert len({hashed_port("F-1-s-5-%d" % a) for a in range(10)}) >= 9


class TestFindFreePort:
    def test_bindable_and_in_range(self):
        port = find_free_port()
        low, high = PORT_RANGE
        assert low <= port <= high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # raises if it was not free

    def test_skips_a_port_in_use(self, monkeypatch):
        busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            taken = busy.getsockname()[1]
            free = find_free_port()
            sequence = iter([taken, taken, free])

            class FakeRandom:
                def randint(self, low, high):
                    return next(sequence)

            monkeypatch.setattr(ports.random, "Random", FakeRandom)
            assert find_free_port(attempts=3) == free
        finally:
            busy.close()

    def test_gives_up_after_attempts(self, monkeypatch):
        busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            taken = busy.getsockname()[1]

            class FakeRandom:
                calls = 0

                def randint(self, low, high):
                    FakeRandom.calls += 1
                    return taken

            monkeypatch.setattr(ports.random, "Random", FakeRandom)
            with pytest.raises(OSError):
                find_free_port(attempts=4)
            assert FakeRandom.calls == 4
        finally:
            busy.close()

    def test_zero_attempts_raises(self):
        with pytest.raises(OSError):
            find_free_port(attempts=0)


class TestTopologyFrom:
    def test_from_namedtuple(self):
        t = topology_from(Parallel("10.1.2.3", 3, 2), {}, "gang", port=24000)
        assert isinstance(t, Topology)
        assert (t.num_nodes, t.node_index, t.main_addr, t.ports, t.is_local) == (
            3,
            2,
            "10.1.2.3",
            (24000,),
            True,
        )
        assert not t.is_control

    def test_control(self):
        t = topology_from(Parallel("h", 2, 0), {}, "gang", port=24000)
        assert t.is_control

    def test_any_object_with_the_attributes(self):
        p = types.SimpleNamespace(main_ip="h", num_nodes="4", node_index="1", extra=1)
        t = topology_from(p, {}, "gang", port=24000)
        assert (t.num_nodes, t.node_index, t.main_addr) == (4, 1, "h")

    def test_ports_follow_choose_ports(self):
        env = {"MF_MASTER_PORT": "22000", "METAFLOW_RUNTIME_ENVIRONMENT": "kubernetes"}
        t = topology_from(Parallel("h", 2, 1), env, "gang")
        assert t.ports == (22000,)
        assert t.is_local is False
        assert topology_from(Parallel("h", 1, 0), {}, "gang").ports == choose_ports({}, "gang")

    @pytest.mark.parametrize(
        "env, local",
        [
            ({}, True),
            ({"METAFLOW_RUNTIME_ENVIRONMENT": "local"}, True),
            ({"METAFLOW_RUNTIME_ENVIRONMENT": "kubernetes"}, False),
            ({"METAFLOW_RUNTIME_ENVIRONMENT": "batch"}, False),
        ],
    )
    def test_is_local(self, env, local):
        assert is_local_runtime(env) is local
        assert topology_from(Parallel("h", 1, 0), env, "g", 24000).is_local is local

    @pytest.mark.parametrize(
        "num, index", [(2, 2), (2, 5), (2, -1), (0, 0), (-1, 0), (1, 1)]
    )
    def test_inconsistent_index_raises(self, num, index):
        with pytest.raises(TorchrunInvalidArgument) as e:
            topology_from(Parallel("h", num, index), {}, "g", 24000)
        assert "node %d of %d" % (index, num) in str(e.value)

    def test_missing_attribute_raises(self):
        with pytest.raises(AttributeError):
            topology_from(types.SimpleNamespace(num_nodes=1, node_index=0), {}, "g")
