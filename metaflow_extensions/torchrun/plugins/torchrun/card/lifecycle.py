"""The step's card in Metaflow's card lifecycle: the ``@card`` added to the
step, the card of the control only, its live refresh while a call runs, and
its final render.

Metaflow renders a card after the task in two ``flow.py card create``
subprocesses (render, then refresh), each importing Metaflow, the flow and this
extension again: about 1 s at the end of every step on 2 cores, 2 s on a GPU
node. This module renders the card in the task itself (10 to 20 ms) with
Metaflow's own card class, card datastore and metadata, so that the Metaflow
client and ``card get/view`` find it exactly as if Metaflow had made it, and
falls back to Metaflow's subprocesses on any error.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Any, Optional

from ..gang import ProgressRecord
from ..host import cuda_devices, log, say
from ..launch import Accelerators
from ..record import TorchrunResult
from . import progress as card_progress
from .content import backend_label, build_components, title_markdown
from .text import clip, escape_markdown

CARD_ID = "torchrun"


def card_view_command(argv0: str, deco: Any, pathspec: str) -> Optional[str]:
    """The command that opens this attempt's card (``deco``'s, None on a node
    without one), and only it: the control task's pathspec (``card view
    <step>`` alone picks any node's task, mostly one without the card) and the
    card's hash. Every attempt of a task keeps its own card under the same id,
    so after a ``@retry`` the id alone matches each attempt's, and Metaflow
    then lists them instead of showing one."""
    if deco is None:
        return None
    card_uuid = getattr(deco, "_card_uuid", None)  # set by the card's task_pre_step
    run_step_task = "/".join(pathspec.split("/")[1:])
    command = "python %s card view %s --id %s" % (
        shlex.quote(os.path.basename(argv0) or "flow.py"), run_step_task, CARD_ID)
    return command + (" --hash %s" % card_uuid if card_uuid else "")


def this_card_hash() -> Optional[str]:
    """This task's @torchrun card's hash (Metaflow's uuid for it), for the
    attempt's record: None where the step has none (``card=False``), or
    before Metaflow has set up ``current.card``."""
    from metaflow import current

    try:
        uuid = getattr(current.card, "_card_id_map", {}).get(CARD_ID)
    except Exception:  # no card on this step, or a Metaflow that keeps cards otherwise
        return None
    return uuid if isinstance(uuid, str) else None


# -- Metaflow card glue: the decorator's hooks call these --------------------


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
    # Metaflow is iterating this very list to call step_init: the card's own
    # step_init runs right after ours.
    decorators.append(deco)
    return deco



def fill_card(result: TorchrunResult, flow_name: str, accelerators: Accelerators, attempt: int = 0) -> bool:
    """Put the run's components into ``current.card["torchrun"]``; False (and
    one line on stderr) where it could not: a card must never fail the step."""
    from metaflow import current

    try:
        card = current.card[CARD_ID]
        card.clear()
        backend = backend_label(accelerators, cuda_devices(os.environ))
        card.extend(build_components(result, flow_name, current.pathspec, backend, attempt))
        return True
    except Exception as e:
        say("could not build the card: %s" % e)
        return False


def refresh_live(progress: ProgressRecord, flow_name: str) -> None:
    """While a call runs on the control: the card's progress section, through
    Metaflow's own runtime refresh (``current.card[...].refresh``, rendered
    by Metaflow in the background); the final card replaces it. Never raises."""
    from metaflow import current
    from metaflow.cards import Markdown, Table

    try:
        card = current.card[CARD_ID]
        card.clear()
        card.extend([
            Markdown(title_markdown(flow_name, current.pathspec, int(current.retry_count or 0))),
            Markdown("_Running: refreshed %s while the step runs; the whole card comes when it ends._"
                     % time.strftime("%Y-%m-%d %H:%M:%S")),
            *card_progress.parts(progress, escape_markdown, clip, Markdown, Table),
        ])
        card.refresh(force=True)
    except Exception as e:  # a card must never fail the step
        log.get("card").debug("live card not refreshed: %s", e)


def finish_card(deco: Any, result: TorchrunResult, flow_name: str, accelerators: Accelerators, attempt: int) -> bool:
    """Fill the card and render it in this process, in place of Metaflow's
    ``card create`` subprocesses at the end of the task. False where Metaflow
    must still render it: the card is filled either way."""
    if not fill_card(result, flow_name, accelerators, attempt):
        return False
    return render_in_task(deco, attempt)


def card_ready(deco: Any) -> bool:
    """Whether the card decorator got as far as its own ``task_pre_step`` (a
    step refused before it, by our checks or another decorator's, has no card
    to render and none to name)."""
    return getattr(deco, "_card_uuid", None) is not None and getattr(deco, "card_creator", None) is not None


def render_card_now(deco: Any, attempt: int) -> bool:
    """Metaflow renders cards of successful tasks only; the card of a failed
    run is the one that matters most. In this process where possible, else with
    Metaflow's own ``card create`` subprocess. False, and nothing said, when
    there is no card to render; one plain line when rendering it failed."""
    if not card_ready(deco):
        return False
    _title_if_empty(attempt)
    if render_in_task(deco, attempt):
        return True
    try:
        deco.card_creator.create(
            mode="render",
            final=True,
            card_uuid=deco._card_uuid,
            user_set_card_id=deco._user_set_card_id,
            runtime_card=deco._is_runtime_card,
            decorator_attributes=deco.attributes,
            card_options=deco.card_options,
            logger=deco._logger,
            sync=True,
        )
        return True
    except Exception as e:
        say("could not render the card of the failed task: %s" % e)
        return False


def _title_if_empty(attempt: int) -> None:
    """A card with nothing in it (the step failed before any record: its
    gang never formed) still says whose it is: the task and the attempt."""
    from metaflow import current
    from metaflow.cards import Markdown

    try:
        card = current.card[CARD_ID]
        if len(card.components) == 0:
            card.extend([Markdown(title_markdown(current.flow_name, current.pathspec, attempt)),
                         Markdown("_The step failed before its gang formed: no record of a call._")])
    except Exception as e:  # a card must never fail the step
        log.get("card").debug("no title for the empty card: %s", e)


# -- Rendering in the task ----------------------------------------------------
#
# What ``card create`` does (metaflow/plugins/cards/card_cli.py), without the
# subprocess: instantiate the card class with the serialized components, render
# it with the reload token of a final render, save the HTML and the refresh data
# with CardDatastore under the card root, and register the card's "card-info"
# metadata (Metaflow 2.16+ only; older versions write none).

_FAILED_ATTR = "_torchrun_in_task_render_failed"


class _TaskView:
    """What a blank card's ``render`` reads of its task: the pathspec. The
    subprocess builds a client ``Task`` for it, a metadata round trip."""

    finished = True

    def __init__(self, pathspec: str) -> None:
        self.pathspec = pathspec


def render_in_task(deco: Any, attempt: int) -> bool:
    """Render ``deco``'s card here and stop Metaflow from rendering it again.
    True when done; on any error False (Metaflow's path then stays in place),
    with one line on stderr the first time."""
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
    """Refuse before writing anything what this module cannot do as Metaflow
    would: another card type (a user's own ``@card(id="torchrun")``), or a
    Metaflow whose task calls ``task_finished_ctx`` rather than ``task_finished``."""
    card_type = deco.attributes.get("type")
    if card_type != "blank":
        raise ValueError("card type %r is not rendered in the task" % card_type)
    if getattr(deco, "task_finished_ctx", None) is not None:
        raise ValueError("this Metaflow finishes cards with task_finished_ctx")
    for name in ("_card_uuid", "_flow_datastore", "_metadata"):
        if getattr(deco, name, None) is None:
            raise ValueError("the card decorator has no %s" % name)


def _render_and_save(deco: Any, attempt: int) -> None:
    from metaflow import current
    from metaflow.plugins import CARDS

    uuid, card_type, card_id = deco._card_uuid, deco.attributes["type"], deco._user_set_card_id
    classes = [c for c in CARDS if c.type == card_type]
    if not classes:
        raise ValueError("no card class of type %r" % card_type)
    components = current.card._serialize_components(uuid)
    options = deco.card_options
    # As `card create`: options only when there are some (the class has defaults).
    card = classes[0](options=options, components=components, graph=None) if options else classes[0](
        components=components, graph=None
    )
    task = _TaskView(current.pathspec)
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
    """A ``current.card.refresh()`` in the step starts an asynchronous
    ``card create`` of the runtime card; one still running could overwrite the
    final card after us. Metaflow waits for it before its final render: so do we
    (no wait when there is none, the usual case)."""
    wait = getattr(deco.card_creator, "_wait_for_async_processes_to_finish", None)
    if wait is not None:
        timeout = deco.attributes.get("timeout")
        wait(deco._card_uuid, 30 if timeout is None else int(timeout) + 10)


def _card_datastore(flow_datastore: Any, pathspec: str) -> Any:
    """A CardDatastore where ``card create`` saves: the card root of the task's
    datastore type (``mf.cards`` beside the local datastore; CARD_S3ROOT...),
    else the task's datastore root. A storage object of its own: ``card
    create`` re-roots its storage, which here is the task's."""
    from metaflow.datastore import FlowDataStore
    from metaflow.plugins.cards.card_datastore import CardDatastore

    impl = flow_datastore._storage_impl
    root = CardDatastore.get_storage_root(impl.TYPE) or flow_datastore.datastore_root
    cards = FlowDataStore(flow_datastore.flow_name, None, storage_impl=type(impl), ds_root=root)
    return CardDatastore(cards, pathspec=pathspec)


def _register_card_info(deco: Any, attempt: int) -> None:
    """The "card-info" metadata Metaflow registers once per card (the UI lists
    cards by it), through the same once-only guard as Metaflow's."""
    should_save = getattr(deco.card_creator, "_should_save_metadata", None)
    if should_save is None:
        return  # Metaflow before 2.16 registers no card metadata
    save, info = should_save(deco._card_uuid)
    if not save:
        return
    from metaflow import current
    from metaflow.plugins.cards.metadata import _save_metadata

    _save_metadata(
        deco._metadata, current.run_id, current.step_name, current.task_id, attempt, deco._card_uuid, info
    )


def card_of_task(deco: Any, is_control: bool) -> Any:
    """The card decorator this task renders: the control's only, since it
    sees the whole gang. Rendering one on every other node would cost each a
    Metaflow start-up on its critical path. The card decorator stays on the
    step's list: Metaflow counted it at step_init and finalises current.card
    only once every counted card has been through task_pre_step, so taking
    it off would break every other card of the step (a user's @card,
    @model's) on this node. Only its render is skipped."""
    if deco is None or is_control:
        return deco
    skip_render(deco)
    return None


def skip_render(deco: Any) -> None:
    """Metaflow calls the card decorator's ``task_finished`` after ours and
    renders the card there. Removing the decorator from the step's list while
    Metaflow iterates that list (for task_post_step or task_exception) would
    make it skip the decorator after ours whenever the card sits before ours;
    shadowing the one hook is safe wherever it sits, and keeps its clean-up
    (the config file it shares with the step's other cards)."""
    cleanup = getattr(deco, "_cleanup", None)

    def task_finished(step_name, *args, **kwargs):
        if cleanup is not None:
            cleanup(step_name)

    deco.task_finished = task_finished
