"""Small typed records for tests of what a call launches (launch/prepare.py)."""

from metaflow_extensions.torchrun.plugins.torchrun.launch.command import restarts_allowed
from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import CallPlan
from metaflow_extensions.torchrun.plugins.torchrun.launch.prepare import NodeFacts


def script_plan(options=None):
    return CallPlan(entry_name="s.py", script="/s.py", entry_argv=[], function=None, function_args=None, nproc=1,
                    options=dict(options or {}), torch_restarts=restarts_allowed(options or {}))


def node_facts(**changes):
    facts = dict(python="python", node_index=0, num_nodes=1, main_addr="127.0.0.1", local_addr="127.0.0.1",
                 iface=None, rdzv_port=29500, rdzv_id="id", workdir="/w", log_dir=None, entry_path="/w/entry.json",
                 flow_dir=None)
    facts.update(changes)
    return NodeFacts(**facts)


def agent_environment(base, work_dir, entry_path, **defaults):
    """torchrun's environment as a call builds it for its agent and ranks
    (``launch/prepare.rank_environment``), for a call in ``work_dir``."""
    from metaflow_extensions.torchrun.plugins.torchrun.launch.plan import StepDefaults
    from metaflow_extensions.torchrun.plugins.torchrun.launch.prepare import rank_environment

    return rank_environment(base, StepDefaults(**defaults), script_plan(),
                            node_facts(workdir=work_dir, entry_path=entry_path))
