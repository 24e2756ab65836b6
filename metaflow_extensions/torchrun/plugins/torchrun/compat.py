"""Compatibility, in pure functions: the Metaflow versions we support and code
written for metaflow-torchrun 0.2 (its attribute names, its single-node
launcher). The torch a task has is ``launch/torch_checks.py``'s.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from .errors import TorchrunInvalidArgument, shown
from .runtime.single_node import SingleNodeLauncher

def decorator_init_kwargs(parent_init: Callable[..., Any], inserted_by: Any) -> Dict[str, Any]:
    """``inserted_by`` for ``StepDecorator.__init__`` where it takes it (Metaflow 2.16+): feature
    detection beats version numbers."""
    try:
        params = inspect.signature(parent_init).parameters
    except (TypeError, ValueError):
        return {}
    if "inserted_by" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return {"inserted_by": inserted_by}
    return {}


def local_control_task_id(task_id: str) -> str:
    """The control task's id where a local worker's environment lacks it (Metaflow before 2.16):
    "<prefix>_node_<i>" -> "control-<prefix>", so that every node derives the same gang id."""
    prefix = str(task_id).split("_node_")[0]
    return prefix if prefix.startswith("control-") else "control-" + prefix


# metaflow-torchrun 0.2's attribute name -> ours (0.2's master_port was torchrun's rendezvous port).
ATTRIBUTE_ALIASES = {
    "master_port": "rdzv_port",
    "all_nodes_started_timeout": "start_timeout",
}
ALIAS_NOTES = {
    "master_port": " It pins torchrun's rendezvous port, as in 0.2; @torchrun(port=N) pins the gang service's.",
}


class LegacyAttributes:
    """@torchrun's attributes in our names, and what 0.2's names in them call for (a plain class: a
    dataclass's making costs every ``import metaflow``, which loads this module, half a millisecond)."""

    def __init__(self, attributes: Dict[str, Any]) -> None:
        self.attributes = attributes
        self.deprecations: List[str] = []
        self.conflicts: List[str] = []


def translate_attributes(attributes: Optional[Mapping[str, Any]]) -> LegacyAttributes:
    """0.2's attribute names renamed to ours; both spellings given is a conflict, refused at flow start."""
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
    """A Metaflow task (``flow.py ... step <name>``), not the user's command, which says the notes once."""
    return "step" in list(argv)[1:]


def task_step(argv: Sequence[str]) -> Optional[str]:
    """The step a Metaflow task process runs (``flow.py [options] step <name> ...``); None in any other."""
    args = list(argv)[1:]
    at = args.index("step") if "step" in args else -1
    return args[at + 1] if 0 <= at < len(args) - 1 else None


def legacy_notes(legacy: LegacyAttributes, say: Callable[[str], None], argv: Iterable[str]) -> None:
    """At flow start: refuse conflicting spellings; say each deprecation once."""
    if legacy.conflicts:
        raise TorchrunInvalidArgument(" ".join(legacy.conflicts))
    if not is_task_process(argv):
        for line in legacy.deprecations:
            say(line)


class TorchrunSingleNodeMultiGPU(SingleNodeLauncher):
    """metaflow-torchrun 0.2's single-node launcher, for an ordinary step (no ``@parallel``):
    ``TorchrunSingleNodeMultiGPU().run(entrypoint="train.py", entrypoint_args={...}, nproc_per_node=N)``,
    supervised like a ``@torchrun`` call; returns a ``TorchrunResult``. ``run`` keeps 0.2's positional
    order (``torchrun_args`` first). ``args_as="0.2"`` spells a dict of entrypoint_args as 0.2 did."""

    def __init__(self, args_as: str = "ours", label_logs: bool = True) -> None:
        super().__init__(args_as=args_as, label_logs=label_logs)


# A @parallel step's worker task: "<control>_node_<i>" locally, "<id>-node-<i>"
# on Kubernetes and AWS Batch (Metaflow's own naming). Compiled at its first use (``re`` keeps it).
_WORKER_TASK = r"^(?P<control>.+?)[-_]node[-_]\d+$"


def control_task_of(task: Any) -> Any:
    """The control task of a @parallel step's worker ``task`` (``card view <run>/train`` resolves to
    any task, mostly a worker, which has no card); ``task`` itself when no control can be told."""
    match = re.match(_WORKER_TASK, str(getattr(task, "id", "")))
    if match is None:
        return task
    try:
        from metaflow import Step

        step = Step(task.pathspec.rsplit("/", 1)[0])
        others = [t for t in step if not re.match(_WORKER_TASK, t.id)]
    except Exception:
        return task
    exact = [t for t in others if t.id == match.group("control")]
    if exact or len(others) == 1:
        return (exact or others)[0]
    return task


def card_commands(argv: Sequence[str]) -> bool:
    """``card view``/``card get`` of a step's pathspec: its control task's card, and ``card view``
    without a browser says where the card is. True when Metaflow's CLI was wrapped."""
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
    return ("view" in argv and headless_card_view(card_cli)) or callable(resolve)


def headless_card_view(card_cli: Any) -> bool:
    """Metaflow's ``open_in_browser`` ignores what ``webbrowser.open`` returns: ``card view`` without a
    browser (SSH to a dev box) printed nothing. Wrapped to say where the card is. True when wrapped."""
    original = getattr(card_cli, "open_in_browser", None)
    if not callable(original) or getattr(original, "_torchrun_headless", False):
        return False

    def open_in_browser(card_path: str) -> None:
        import webbrowser  # `import metaflow` loads this module; a card is opened rarely

        if not webbrowser.open("file://" + os.path.abspath(card_path)):
            print("No web browser here: the card is at %s (`card get` writes it where you like)."
                  % os.path.abspath(card_path), file=sys.stderr, flush=True)

    open_in_browser._torchrun_headless = True  # type: ignore[attr-defined]
    card_cli.open_in_browser = open_in_browser
    return True
