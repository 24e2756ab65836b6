"""Flow-level checks of ``@torchrun`` steps, run when the flow starts."""

from __future__ import annotations

from typing import Optional

from .errors import TorchrunInvalidArgument


def missing_num_parallel(graph, step_name: str) -> Optional[str]:
    node = graph[step_name]
    for parent in node.in_funcs:
        if not graph[parent].parallel_foreach:
            return (
                "step *%s* has @torchrun but step *%s* enters it without num_parallel. "
                "Write self.next(self.%s, num_parallel=N) to run it on N nodes "
                "(num_parallel=1 runs a single node with several processes)."
                % (step_name, parent, step_name)
            )
    return None


def require_parallel_entry(graph, step_name: str) -> None:
    message = missing_num_parallel(graph, step_name)
    if message:  # the stars mark the step names for Metaflow's lint warning; our error prints as written
        raise TorchrunInvalidArgument(message.replace("*", ""))


def _lint_torchrun_steps(graph) -> None:
    from metaflow.lint import LintWarn

    for node in graph:
        if not any(getattr(d, "name", None) == "torchrun" for d in node.decorators):
            continue
        try:
            message = missing_num_parallel(graph, node.name)
        except KeyError:  # a broken graph: Metaflow's own checks report it
            continue
        if message:
            raise LintWarn(message, node.func_lineno, node.source_file)


def register_lint_check() -> None:
    """Our check before Metaflow's split/join balance check, whose "join not preceded by a split" hides it."""
    try:
        from metaflow.lint import linter
    except ImportError:
        return
    checks = getattr(linter, "_checks", None)
    if not isinstance(checks, list) or _lint_torchrun_steps in checks:
        return
    linter.ensure_static_graph(linter.check(_lint_torchrun_steps))
    checks.remove(_lint_torchrun_steps)
    names = [getattr(c, "__name__", "") for c in checks]
    at = names.index("check_split_join_balance") if "check_split_join_balance" in names else len(checks)
    checks.insert(at, _lint_torchrun_steps)
