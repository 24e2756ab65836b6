"""Progress from HF's and Lightning's ``Trainer`` with no change to the user's code.

An import hook adds a callback once the script imports a trainer; on the hot path
the callback does no I/O and forces no device sync.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import logging
import math
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import rank_progress

_log = logging.getLogger("metaflow_torchrun")

_HF = "transformers.trainer"
_LIGHTNING = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")
CALLBACK_NAME = "TorchrunProgress"


def install() -> None:
    watched: Dict[str, Callable[[Any], None]] = {_HF: add_to_hf}
    watched.update(dict.fromkeys(_LIGHTNING, add_to_lightning))
    after_import(CALLBACK_NAME, watched)


def after_import(tag: str, watched: Dict[str, Callable[[Any], None]]) -> None:
    """Runs each patch once its module has run (at once if it has); a second call with ``tag`` does nothing.
    Patches of several tags on one module all run, in one wrapped loader."""
    if not any(getattr(f, "tag", None) == tag for f in sys.meta_path):
        watched = dict(watched)
        for name in [n for n in watched if n in sys.modules]:  # imported already (function mode, a test)
            _patch(watched.pop(name), sys.modules[name])
        sys.meta_path.insert(0, _AfterImport(tag, watched))


def _patch(patch: Callable[[Any], None], module: Any) -> None:
    """Never fails the user's import: a trainer we cannot hook trains unreported."""
    try:
        patch(module)
    except Exception as e:  # a version whose internals moved
        _log.debug("progress: could not hook %s: %s", getattr(module, "__name__", module), e)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps a watched module's loader, so its patches (every tag's) run once the module has run."""

    def __init__(self, tag: str, watched: Dict[str, Callable[[Any], None]]) -> None:
        self.tag, self.watched = tag, watched

    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if name not in self.watched:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if not isinstance(finder, _AfterImport) and find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        patches = [f.watched.pop(name) for f in sys.meta_path if isinstance(f, _AfterImport) and name in f.watched]
        spec.loader = _Patching(spec.loader, patches)
        return spec


class _Patching(importlib.abc.Loader):
    def __init__(self, loader: Any, patches: List[Callable[[Any], None]]) -> None:
        self.loader, self.patches = loader, patches

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        for patch in self.patches:
            _patch(patch, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def add_to_hf(module: Any) -> None:
    from transformers.trainer_callback import TrainerCallback

    defaults = module.DEFAULT_CALLBACKS
    if not any(getattr(c, "__name__", "") == CALLBACK_NAME for c in defaults):
        defaults.append(hf_callback(TrainerCallback))


def hf_callback(base: type) -> type:
    class TorchrunProgress(base):
        def __init__(self) -> None:
            self.metrics: Dict[str, Any] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Mapping] = None, **kwargs: Any) -> None:
            # HF logs after the step's end: the step goes again, with its own loss.
            logged = {n: v for n, v in (logs or {}).items() if n in ("loss", "learning_rate")
                      and isinstance(v, (int, float))}
            if logged:
                self.metrics.update(logged)
                rank_progress.report(state.global_step, state.max_steps or None, **self.metrics)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            lr = last_lr(kwargs.get("lr_scheduler"))
            if lr is not None:
                self.metrics["learning_rate"] = lr
            rank_progress.report(state.global_step, state.max_steps or None, **self.metrics)

    TorchrunProgress.__name__ = TorchrunProgress.__qualname__ = CALLBACK_NAME
    return TorchrunProgress


def last_lr(scheduler: Any) -> Optional[float]:
    try:
        return float(scheduler.get_last_lr()[0])
    except Exception:
        return None


def add_to_lightning(module: Any) -> None:
    with_lightning_callback(module, lightning_callback, CALLBACK_NAME, "_torchrun_progress")


def with_lightning_callback(module: Any, make: Callable[[type], type], name: str, marker: str) -> Optional[str]:
    """Every ``Trainer`` of Lightning's ``module`` built from now on gets the callback ``make`` builds on
    Lightning's own ``Callback`` (once, by its class's ``name``): progress and snapshots alike. The
    package's name (``lightning.pytorch`` or ``pytorch_lightning``), or None where ``marker`` says it is
    done already."""
    package = module.__name__.rsplit(".trainer.trainer", 1)[0]
    callback = make(importlib.import_module(package + ".callbacks").Callback)
    trainer = module.Trainer
    init = trainer.__init__
    if getattr(init, marker, False):
        return None

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not any(type(c).__name__ == name for c in self.callbacks):
            self.callbacks.append(callback())

    setattr(__init__, marker, True)
    trainer.__init__ = __init__
    return package


def lightning_callback(base: type) -> type:
    class TorchrunProgress(base):
        def __init__(self) -> None:
            self.total: Optional[int] = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.total = lightning_total(trainer)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            metrics: Dict[str, Any] = {}
            loss: Any = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            if hasattr(loss, "detach"):
                metrics["loss"] = loss.detach()  # read once a second, off the hot path
            try:
                metrics["learning_rate"] = float(trainer.optimizers[0].param_groups[0]["lr"])
            except Exception:
                pass
            rank_progress.report(trainer.global_step, self.total, **metrics)

    TorchrunProgress.__name__ = TorchrunProgress.__qualname__ = CALLBACK_NAME
    return TorchrunProgress


def lightning_total(trainer: Any) -> Optional[int]:
    steps = getattr(trainer, "max_steps", -1)
    if isinstance(steps, int) and steps > 0:
        return steps
    try:
        expected = float(trainer.estimated_stepping_batches)
    except Exception:
        return None
    return int(expected) if math.isfinite(expected) and expected > 0 else None
