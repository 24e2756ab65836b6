"""The step's card in Metaflow's card lifecycle: added to the step, the control's only, refreshed
live, and rendered in the task rather than in Metaflow's two ``card create`` subprocesses, falling
back to them on any error (docs/design.md, "The card is rendered in the task").
"""

from __future__ import annotations

import os
import shlex
import time
from types import SimpleNamespace
from typing import Any, Optional

from .. import load_order  # noqa: F401  (Metaflow first, whatever the user imports first)
from metaflow import current
from metaflow.cards import Markdown
from metaflow.datastore import FlowDataStore
from metaflow.plugins import CARDS
from metaflow.plugins.cards.card_datastore import CardDatastore

from ..gang import ProgressRecord
from ..host.console import say
from ..host.devices import cuda_devices
from ..host import log
from ..launch import Accelerators
from ..record.result import TorchrunResult
from . import progress as card_progress
from .content import backend_label, build_components, title_markdown
from .text import with_wrap_style

CARD_ID = "torchrun"


def card_view_command(argv0: str, deco: Any, pathspec: str) -> Optional[str]:
    """The command that opens this attempt's card and only it (None without a card): by the control
    task's pathspec and the card's hash, since after a ``@retry`` the id alone matches every attempt's."""
    if deco is None:
        return None
    card_uuid = getattr(deco, "_card_uuid", None)  # set by the card's task_pre_step
    run_step_task = "/".join(pathspec.split("/")[1:])
    command = "python %s card view %s --id %s" % (
        shlex.quote(os.path.basename(argv0) or "flow.py"), run_step_task, CARD_ID)
    return command + (" --hash %s" % card_uuid if card_uuid else "")


def this_card_hash() -> Optional[str]:
    """This task's card's hash for the attempt's record; None without a card or before ``current.card``."""
    try:
        uuid = getattr(current.card, "_card_id_map", {}).get(CARD_ID)
    except Exception:  # no card on this step, or a Metaflow that keeps cards otherwise
        return None
    return uuid if isinstance(uuid, str) else None


def attach_card(decorators) -> Optional[Any]:
    """Add ``@card(type="blank", id="torchrun")`` to the step unless present."""
    try:
        from metaflow.plugins.cards.card_decorator import CardDecorator
    except ImportError:
        return None
    for deco in decorators:
        if isinstance(deco, CardDecorator) and deco.attributes.get("id") == CARD_ID:
            return deco
    deco = CardDecorator(attributes={"type": "blank", "id": CARD_ID})
    if hasattr(deco, "external_init"):  # Metaflow 2.16+; before, __init__ did it all
        deco.external_init()
    decorators.append(deco)  # Metaflow is iterating this list: the card's step_init runs after ours
    return deco


def refresh_live(progress: ProgressRecord, flow_name: str) -> None:
    """The progress section while a call runs, through Metaflow's runtime refresh; never raises."""
    try:
        card = current.card[CARD_ID]
        card.clear()
        card.extend([
            Markdown(title_markdown(flow_name, current.pathspec, int(current.retry_count or 0))),
            Markdown(with_wrap_style("_Running: refreshed %s while the step runs; the whole card comes when it "
                                     "ends._" % time.strftime("%Y-%m-%d %H:%M:%S"))),
            *card_progress.parts(progress),
        ])
        card.refresh(force=True)
    except Exception as e:  # a card must never fail the step
        log.get("card").debug("live card not refreshed: %s", e)


def finish_card(deco: Any, result: TorchrunResult, flow_name: str, accelerators: Accelerators, attempt: int) -> bool:
    """Fill the card and render it here; False where Metaflow must still render it (one line on
    stderr where it could not be filled: a card must never fail the step)."""
    try:
        card = current.card[CARD_ID]
        card.clear()
        backend = backend_label(accelerators, cuda_devices(os.environ))
        card.extend(build_components(result, flow_name, current.pathspec, backend, attempt))
    except Exception as e:
        say("could not build the card: %s" % e)
        return False
    return render_in_task(deco, attempt)


def card_ready(deco: Any) -> bool:
    """Whether the card decorator reached its ``task_pre_step`` (a step refused before has no card)."""
    return getattr(deco, "_card_uuid", None) is not None and getattr(deco, "card_creator", None) is not None


def render_card_now(deco: Any, attempt: int) -> bool:
    """A failed task's card, which Metaflow does not render: here where possible, else with Metaflow's
    ``card create``. False when there is none, or (one line said) when rendering it failed."""
    if not card_ready(deco):
        return False
    _title_if_empty(attempt)
    if render_in_task(deco, attempt):
        return True
    try:
        deco.card_creator.create(
            mode="render", final=True, card_uuid=deco._card_uuid, user_set_card_id=deco._user_set_card_id,
            runtime_card=deco._is_runtime_card, decorator_attributes=deco.attributes, card_options=deco.card_options,
            logger=deco._logger, sync=True,
        )
        return True
    except Exception as e:
        say("could not render the card of the failed task: %s" % e)
        return False


def _title_if_empty(attempt: int) -> None:
    """An empty card (the gang never formed) still says whose it is."""
    try:
        card = current.card[CARD_ID]
        if len(card.components) == 0:
            card.extend([Markdown(title_markdown(current.flow_name, current.pathspec, attempt)),
                         Markdown("_The step failed before its gang formed: no record of a call._")])
    except Exception as e:  # a card must never fail the step
        log.get("card").debug("no title for the empty card: %s", e)


# Rendering in the task: what ``card create`` does (metaflow/plugins/cards/card_cli.py), in this process.
_FAILED_ATTR = "_torchrun_in_task_render_failed"


def render_in_task(deco: Any, attempt: int) -> bool:
    """Render ``deco``'s card here and stop Metaflow from rendering it again. False on any error
    (Metaflow's path stays in place), said once."""
    if getattr(deco, _FAILED_ATTR, False):
        return False
    try:
        _check_renderable(deco)
        _render_and_save(deco, attempt)
        skip_render(deco)
        return True
    except Exception as e:
        setattr(deco, _FAILED_ATTR, True)
        say("rendering the card in the task failed (%s: %s); Metaflow renders it" % (type(e).__name__, e))
        return False


def _check_renderable(deco: Any) -> None:
    """Before writing anything: refuse what we cannot render as Metaflow would."""
    card_type = deco.attributes.get("type")
    if card_type != "blank":
        raise ValueError("card type %r is not rendered in the task" % card_type)
    if getattr(deco, "task_finished_ctx", None) is not None:
        raise ValueError("this Metaflow finishes cards with task_finished_ctx")
    for name in ("_card_uuid", "_flow_datastore", "_metadata"):
        if getattr(deco, name, None) is None:
            raise ValueError("the card decorator has no %s" % name)


def _render_and_save(deco: Any, attempt: int) -> None:
    uuid, card_type, card_id = deco._card_uuid, deco.attributes["type"], deco._user_set_card_id
    classes = [c for c in CARDS if c.type == card_type]
    if not classes:
        raise ValueError("no card class of type %r" % card_type)
    # As `card create`: options only when there are some (the class has defaults).
    options = {"options": deco.card_options} if deco.card_options else {}
    card = classes[0](components=current.card._serialize_components(uuid), graph=None, **options)
    task = SimpleNamespace(pathspec=current.pathspec, finished=True)  # all a blank card reads of its task
    # A final render's reload token is "final" whatever the card's policy.
    html = card.render(task).replace(card.RELOAD_POLICY_TOKEN, "final")
    if not html:
        raise ValueError("the card rendered nothing")
    _wait_for_runtime_renders(deco)
    store = _card_datastore(deco._flow_datastore, current.pathspec)
    store.save_card(uuid, card_type, html, card_id=card_id)
    refreshed = card.refresh(task, current.card._get_latest_data(uuid, final=True, mode="refresh"))
    if refreshed is not None:
        payload = {"reload_token": "final", "data": refreshed, "created_on": time.time()}
        store.save_data(uuid, card_type, payload, card_id=card_id)
    _register_card_info(deco, attempt)


def _wait_for_runtime_renders(deco: Any) -> None:
    """A runtime ``card create`` still running (``current.card.refresh()``) could overwrite the final
    card: waited for, as Metaflow does before its final render."""
    wait = getattr(deco.card_creator, "_wait_for_async_processes_to_finish", None)
    if wait is not None:
        timeout = deco.attributes.get("timeout")
        wait(deco._card_uuid, 30 if timeout is None else int(timeout) + 10)


def _card_datastore(flow_datastore: Any, pathspec: str) -> Any:
    """A CardDatastore where ``card create`` saves (the card root, else the datastore's), on a storage
    object of its own: ``card create`` re-roots its storage, which here is the task's."""
    impl = flow_datastore._storage_impl
    root = CardDatastore.get_storage_root(impl.TYPE) or flow_datastore.datastore_root
    cards = FlowDataStore(flow_datastore.flow_name, None, storage_impl=type(impl), ds_root=root)
    return CardDatastore(cards, pathspec=pathspec)


def _register_card_info(deco: Any, attempt: int) -> None:
    """The "card-info" metadata (the UI lists cards by it), through Metaflow's once-only guard."""
    should_save = getattr(deco.card_creator, "_should_save_metadata", None)
    if should_save is None:
        return  # Metaflow before 2.16 registers no card metadata
    save, info = should_save(deco._card_uuid)
    if not save:
        return
    from metaflow.plugins.cards.metadata import _save_metadata  # Metaflow 2.16+ only: asked for here

    _save_metadata(deco._metadata, current.run_id, current.step_name, current.task_id, attempt, deco._card_uuid, info)


def card_of_task(deco: Any, is_control: bool) -> Any:
    """The card decorator this task renders: the control's only (it sees the whole gang). Elsewhere
    only its render is skipped: it stays on the step's list (docs/design.md says why)."""
    if deco is None or is_control:
        return deco
    skip_render(deco)
    return None


def skip_render(deco: Any) -> None:
    """Shadow the card decorator's ``task_finished`` (where Metaflow renders), keeping its clean-up;
    removing it from the list Metaflow is iterating would skip the decorator after ours."""
    cleanup = getattr(deco, "_cleanup", None)

    def task_finished(step_name, *args, **kwargs):
        if cleanup is not None:
            cleanup(step_name)

    deco.task_finished = task_finished
