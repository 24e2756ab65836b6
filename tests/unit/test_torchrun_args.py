"""0.2's ``current.torch.torchrun_args`` (issue 41) and the line that keeps a
``False`` from changing meaning silently."""

import copy
import dataclasses
import pickle
import socket

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunException
from metaflow_extensions.torchrun.plugins.torchrun.gang import ports
from metaflow_extensions.torchrun.plugins.torchrun.gang.topology import Topology
from metaflow_extensions.torchrun.plugins.torchrun.launch import plan
from metaflow_extensions.torchrun.plugins.torchrun.runtime import torchrun_args as ta


@dataclasses.dataclass(eq=False)
class Identity:
    gang_id: str = "Flow-1-train-control-1-0"


@dataclasses.dataclass(eq=False)
class Context:
    """The parts of the step's context (runtime/context.py) torchrun_args reads."""

    topology: Topology
    defaults: plan.StepDefaults = plan.StepDefaults()
    identity: Identity = dataclasses.field(default_factory=Identity)

    @property
    def is_control(self):
        return self.topology.is_control


@dataclasses.dataclass(eq=False)
class Session:
    context: Context


def node(index, num_nodes=2, **defaults):
    topology = Topology(num_nodes=num_nodes, node_index=index, main_addr="127.0.0.1", ports=(1,), is_local=True)
    return Session(Context(topology, plan.StepDefaults(**defaults)))


def test_every_node_gets_0_2s_keys_with_one_port_unasked():
    control, worker = ta.torchrun_args_of(node(0)), ta.torchrun_args_of(node(1))
    assert tuple(control) == ("nnodes", "master_addr", "master_port", "node_rank", "nproc_per_node")  # 0.2's order
    assert control["nnodes"] == worker["nnodes"] == 2 and (control["node_rank"], worker["node_rank"]) == (0, 1)
    assert control["master_addr"] == "127.0.0.1" and control["nproc_per_node"] == 1
    assert control["master_port"] == worker["master_port"] == ports.own_command_port(Identity().gang_id)
    low, high = ports.PORT_RANGE
    assert low <= control["master_port"] <= high
    other = ports.own_command_port("Flow-1-train-control-1-1")  # the next attempt: a new gang, a new port
    assert other != control["master_port"]


def test_the_steps_settings_are_what_the_values_say():
    args = ta.torchrun_args_of(node(1, nproc_per_node=3, rdzv_port=29511))
    assert args["nproc_per_node"] == 3 and args["master_port"] == 29511
    assert ta.torchrun_args_of(node(1, torchrun_args={"nproc_per_node": 4}))["nproc_per_node"] == 4
    assert ta.torchrun_args_of(node(1, derived_nproc=8))["nproc_per_node"] == 8  # the step's GPUs
    counted = ta.torchrun_args_of(node(1, nproc_per_node="cpu"))["nproc_per_node"]
    assert isinstance(counted, int) and counted >= 1  # a word, counted on this node


def test_the_first_read_fixes_the_values_for_the_step():
    session = node(0)
    assert ta.torchrun_args_of(session) is ta.torchrun_args_of(session)


def test_it_is_read_only_with_a_sentence_and_copies_are_plain_dicts():
    args = ta.torchrun_args_of(node(0))
    for change in (lambda a: a.__setitem__("master_port", 1), lambda a: a.update(nnodes=3),
                   lambda a: a.pop("nnodes"), lambda a: a.clear(), lambda a: a.setdefault("x", 1)):
        with pytest.raises(TorchrunException, match="read-only.*dict\\(current.torch.torchrun_args\\)"):
            change(args)
    for plain in (dict(args), args.copy(), copy.copy(args), copy.deepcopy(args), pickle.loads(pickle.dumps(args))):
        assert type(plain) is dict and plain == args
        plain["master_port"] = 1  # the user's own copy is theirs to change


def test_a_taken_port_on_the_control_fails_naming_the_fix():
    session = node(0)
    taken = ports.own_command_port(session.context.identity.gang_id)
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        with pytest.raises(TorchrunException, match="master_port %d is in use.*rdzv_port=N" % taken):
            ta.torchrun_args_of(session)
        assert ta.torchrun_args_of(node(1))["master_port"] == taken  # a worker does not host the store


def test_false_in_entrypoint_args_is_said_naming_the_option_and_false(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    planned = plan.plan_call(str(script), {"fp16": False, "bf16": True}, 1, None, plan.StepDefaults(), [str(tmp_path)])
    assert planned.entry_argv == ["--bf16"]
    (note,) = planned.notes
    assert "--fp16 out" in note and "write 'fp16': 'false'" in note
    as_0_2 = plan.plan_call(str(script), {"fp16": False}, 1, None, plan.StepDefaults(args_as="0.2"), [str(tmp_path)])
    assert as_0_2.entry_argv == ["--fp16", "false"] and as_0_2.notes == ()  # 0.2's spelling: nothing left out
    quiet = plan.plan_call(str(script), {"fp16": "false"}, 1, None, plan.StepDefaults(), [str(tmp_path)])
    assert quiet.entry_argv == ["--fp16", "false"] and quiet.notes == ()


def test_current_torch_role_says_a_nodes_part_with_spares_and_is_read_only():
    from metaflow_extensions.torchrun.plugins.torchrun.gang.bench import Bench
    from metaflow_extensions.torchrun.plugins.torchrun.gang.identity import GangIdentity
    from metaflow_extensions.torchrun.plugins.torchrun.handle import TorchrunHandle
    from metaflow_extensions.torchrun.plugins.torchrun.gang.messages import Go
    from metaflow_extensions.torchrun.plugins.torchrun.gang.ports import find_free_port
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.context import StepContext
    from metaflow_extensions.torchrun.plugins.torchrun.runtime.session import GangSession

    port = find_free_port()

    def handle(index, spares):
        topology = Topology(num_nodes=3, node_index=index, main_addr="127.0.0.1", ports=(port,), is_local=True)
        session = GangSession(StepContext(GangIdentity("F", "1", "train", "2", 0),
                                          plan.StepDefaults(restarts=1, spares=spares), topology, b"s" * 32))
        return TorchrunHandle(lambda: session)

    # Before the first call: the step's start's bench (the last K nodes wait).
    assert [handle(i, 1).role for i in range(3)] == ["active", "active", "spare"]
    assert [handle(i, 0).role for i in range(3)] == ["active"] * 3
    # As the calls said it: node 1 taken out, node 2 brought in.
    swapped = [handle(i, 1) for i in range(3)]
    try:
        for torch in swapped:  # as a call's go said it, heard by each node's client
            torch.session.join()
            torch.session.client.news.heard(Go(0, 29500, Bench(spares=(), out=(1,))))
        roles = [t.role for t in swapped]
    finally:
        for torch in swapped:
            torch.session.close()
    assert roles == ["active", "out", "active"]
    assert [t.role for t in swapped] == ["active", "out", "active"]
    with pytest.raises(AttributeError):
        swapped[0].role = "spare"
    with pytest.raises(TorchrunException, match="current.torch.role can only be read in the step's own code"):
        _ = TorchrunHandle().role
