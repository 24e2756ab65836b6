"""Compatibility, in pure functions: the Metaflow versions we support and code
written for metaflow-torchrun 0.2 (its attribute names, its single-node
launcher). The torch a task has is ``launch/torch_checks.py``'s.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from .errors import TorchrunInvalidArgument, shown

# ---------------------------------------------------------------- Metaflow versions


def accepts_keyword(func: Callable[..., Any], name: str) -> bool:
    """Whether ``func`` takes the keyword ``name`` (Metaflow grows hook arguments
    over versions; feature detection beats version numbers)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def decorator_init_kwargs(parent_init: Callable[..., Any], inserted_by: Any) -> Dict[str, Any]:
    """Keyword arguments for ``StepDecorator.__init__`` beyond attributes and
    statically_defined: ``inserted_by`` exists from Metaflow 2.16 on."""
    if accepts_keyword(parent_init, "inserted_by"):
        return {"inserted_by": inserted_by}
    return {}


def local_control_task_id(task_id: str) -> str:
    """The control task's id, seen from a local worker node whose environment does
    not name it (Metaflow before 2.16 sets no MF_PARALLEL_CONTROL_TASK_ID). Local
    workers are "<run>-<split step>-<n>_node_<i>" and their control is
    "control-<run>-<split step>-<n>"; every node must derive the same gang id."""
    prefix = str(task_id).split("_node_")[0]
    return prefix if prefix.startswith("control-") else "control-" + prefix


# ---------------------------------------------------- metaflow-torchrun 0.2 names

# Old attribute name -> the attribute that does the same here.
ATTRIBUTE_ALIASES = {
    # 0.2 passed it to torchrun as its rendezvous port (--master_port and
    # --rdzv_endpoint): rdzv_port pins that port here. port is the gang's own.
    "master_port": "rdzv_port",
    "all_nodes_started_timeout": "start_timeout",
}


ALIAS_NOTES = {
    "master_port": " It pins torchrun's rendezvous port, as in 0.2; @torchrun(port=N) pins the gang service's.",
}


@dataclass
class LegacyAttributes:
    """``@torchrun(...)`` attributes with 0.2 names translated; what to tell."""

    attributes: Dict[str, Any]
    deprecations: List[str] = field(default_factory=list)
    conflicts: List[str] = field(default_factory=list)


def translate_attributes(attributes: Optional[Mapping[str, Any]]) -> LegacyAttributes:
    """Rename 0.2 attributes (``master_port``, ``all_nodes_started_timeout``) to
    their names here. Giving both spellings is a conflict, reported at flow start."""
    out = dict(attributes or {})
    result = LegacyAttributes(out)
    for old, new in ATTRIBUTE_ALIASES.items():
        if old not in out:
            continue
        value = out.pop(old)
        if out.get(new) is not None and out[new] != value:
            result.conflicts.append(
                "@torchrun(%s=%s, %s=%s): %s is the metaflow-torchrun 0.2 name of %s; "
                "give only %s." % (old, shown(value), new, shown(out[new]), old, new, new)
            )
            continue
        out[new] = value
        result.deprecations.append(
            "%s= is deprecated (metaflow-torchrun 0.2); it is now %s=, "
            "which this step uses.%s" % (old, new, ALIAS_NOTES.get(old, ""))
        )
    return result


def is_task_process(argv: Iterable[str]) -> bool:
    """A Metaflow task (``flow.py ... step <name> ...``) rather than the command
    the user typed: deprecation lines are said once, by the latter."""
    return "step" in list(argv)[1:]


def legacy_notes(legacy: LegacyAttributes, say: Callable[[str], None], argv: Iterable[str]) -> None:
    """At flow start: refuse conflicting spellings; say each deprecation once."""
    if legacy.conflicts:
        raise TorchrunInvalidArgument(" ".join(legacy.conflicts))
    if not is_task_process(argv):
        for line in legacy.deprecations:
            say(line)


class TorchrunSingleNodeMultiGPU:
    """metaflow-torchrun 0.2's single-node launcher, for an ordinary step (no
    ``@parallel``): ``TorchrunSingleNodeMultiGPU().run(entrypoint="train.py",
    entrypoint_args={...}, nproc_per_node=N)``. Supervised like a
    ``@torchrun`` call (``runtime/single_node.py``); returns a ``TorchrunResult``.
    ``args_as="0.2"`` spells a dict of entrypoint_args as 0.2 did."""

    def __init__(self, args_as: str = "ours", label_logs: bool = True) -> None:
        from .runtime import SingleNodeLauncher

        self._launcher = SingleNodeLauncher(args_as=args_as, label_logs=label_logs)

    @property
    def last_result(self) -> Any:
        return self._launcher.last_result

    def run(self, /, *args: Any, **kwargs: Any) -> Any:
        """0.2's signature and positional order: ``run(torchrun_args, entrypoint,
        entrypoint_args, nproc_per_node)``. ``SingleNodeLauncher.run`` reads any
        call, refusing a wrong one by name (never a ``TypeError``)."""
        return self._launcher.run(*args, **kwargs)


# A @parallel step's worker task: "<control>_node_<i>" locally, "<id>-node-<i>"
# on Kubernetes and AWS Batch (Metaflow's own naming).
_WORKER_TASK = re.compile(r"^(?P<control>.+?)[-_]node[-_]\d+$")


def control_task_of(task: Any) -> Any:
    """``card view <run>/train`` resolves to any task of the step, mostly a
    worker, which has no card: the control task of a @parallel step instead.
    ``task`` itself when it is no worker or no control can be told."""
    match = _WORKER_TASK.match(str(getattr(task, "id", "")))
    if match is None:
        return task
    try:
        from metaflow import Step

        step = Step(task.pathspec.rsplit("/", 1)[0])
        others = [t for t in step if not _WORKER_TASK.match(t.id)]
    except Exception:
        return task
    exact = [t for t in others if t.id == match.group("control")]
    if exact or len(others) == 1:
        return (exact or others)[0]
    return task


def card_commands(argv: Sequence[str]) -> bool:
    """``card view``/``card get``: a step's pathspec names its control task's
    card (``control_task_of``), and ``card view`` without a browser says where
    the card is (``headless_card_view``). True when Metaflow's CLI was wrapped."""
    if "card" not in argv or not ({"view", "get"} & set(argv)):
        return False
    try:
        from metaflow.plugins.cards import card_cli
    except ImportError:
        return False
    resolve = getattr(card_cli, "resolve_task_from_pathspec", None)
    if callable(resolve) and not getattr(resolve, "_torchrun", False):
        def resolve_task_from_pathspec(flow_name: str, pathspec: str) -> Any:
            task = resolve(flow_name, pathspec)
            return control_task_of(task) if pathspec.count("/") < 2 else task

        resolve_task_from_pathspec._torchrun = True  # type: ignore[attr-defined]
        card_cli.resolve_task_from_pathspec = resolve_task_from_pathspec
    return headless_card_view(argv) or callable(resolve)


def headless_card_view(argv: Sequence[str]) -> bool:
    """``flow.py card view`` on a machine without a browser (SSH to a dev box)
    printed nothing and exited 0: Metaflow's ``open_in_browser`` ignores what
    ``webbrowser.open`` returns. Wrapped, for that command only, to say where
    the card's HTML is when no browser took it. True when wrapped."""
    if "card" not in argv or "view" not in argv:
        return False
    try:
        from metaflow.plugins.cards import card_cli
    except ImportError:
        return False
    original = getattr(card_cli, "open_in_browser", None)
    if not callable(original) or getattr(original, "_torchrun_headless", False):
        return False

    def open_in_browser(card_path: str) -> None:
        import webbrowser

        url = "file://" + os.path.abspath(card_path)
        if not webbrowser.open(url):
            print("No web browser here: the card is at %s (`card get` writes it where you like)."
                  % os.path.abspath(card_path), file=sys.stderr, flush=True)

    open_in_browser._torchrun_headless = True  # type: ignore[attr-defined]
    card_cli.open_in_browser = open_in_browser
    return True
