"""The card of each attempt, and what it shows as text (issue 52): the command
that opens one attempt's card, the attempt in its heading, no entity shown as
typed, a hang's suspects, and the Attempts and Goodput tables agreeing.

Uses test_card.py's task (Metaflow's real card decorator and card datastore on a
local datastore in a temporary directory)."""

from __future__ import annotations

import html
import re

import records
import test_card
from test_card import FLOW, _card, _components, _result

from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import NONE
from metaflow_extensions.torchrun.plugins.torchrun.procs.culprit import FLIGHT_RECORDER, Culprits, Suspect
from metaflow_extensions.torchrun.plugins.torchrun.card import content as card_content
from metaflow_extensions.torchrun.plugins.torchrun.card import lifecycle as card_life
from metaflow_extensions.torchrun.plugins.torchrun.record import goodput
from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import Attempt, CallStart, with_costs
from metaflow_extensions.torchrun.plugins.torchrun.record.what_ran import Ran

task = test_card.task  # the fixture: a task with Metaflow's real card decorator, before its step


class _Deco:
    def __init__(self, uuid):
        self._card_uuid = uuid


def test_the_printed_command_names_the_attempts_card_by_its_hash():
    assert card_life.card_view_command("/home/me/my flow.py", _Deco("0a1b2c"), "F/17/train/2") == (
        "python 'my flow.py' card view 17/train/2 --id torchrun --hash 0a1b2c")
    # Before the card has a hash (its decorator never reached task_pre_step): the id alone.
    assert card_life.card_view_command("flow.py", _Deco(None), "F/17/train/2") == (
        "python flow.py card view 17/train/2 --id torchrun")
    assert card_life.card_view_command("flow.py", None, "F/17/train/2") is None  # a node without the card


def _title(task) -> str:
    return [p["source"] for p in _components(_card(task).get()) if p["type"] == "markdown"][0]


def test_the_cards_heading_says_which_attempt_it_is(task):
    assert card_life.finish_card(task.deco, _result(succeeded=False), FLOW, NONE, 3)
    title = _title(task)
    assert title.startswith("# @torchrun: %s, attempt 3\n" % FLOW) and "(attempt 3)" in title


def test_an_empty_card_of_a_failed_attempt_still_says_whose_it_is(task):
    assert card_life.render_card_now(task.deco, 2)
    assert _title(task).startswith("# @torchrun: %s, attempt 2" % FLOW)


# -- What a reader sees ---------------------------------------------------------

_ENTITY = re.compile(r"&(#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def _visible(parts: list) -> list:
    """The text a reader of the card sees, per component, as Metaflow's card
    page draws it: a table cell (and header) as text, as it is; Markdown's code
    spans as typed; the rest of Markdown with its tags dropped and its
    entities decoded once (raw HTML blocks pass through the renderer)."""
    out = []
    for p in parts:
        if p["type"] == "table":
            out += [str(c) for row in p["data"] for c in row] + [str(h) for h in p.get("columns") or []]
        elif p["type"] == "markdown":
            source = p["source"]
            out += [m.group(2) for m in _CODE_SPAN.finditer(source)]
            rest = re.sub(r"<[^>]*>", " ", _CODE_SPAN.sub(" ", source))
            out.append(html.unescape(rest))
    return out


def _full_card_result():
    """A failed call whose every section holds text with ' & < > \" in it,
    none of it hostile: what any user's names and messages hold."""
    result = _result(succeeded=False)
    result.cause = records.cause({"summary": "rank 1 raised: ValueError: can't parse <x> & \"y\"", "rank": 1,
                                  "node_index": 0})
    result.ran = Ran("it's <train>.py", "script", ["--name", "a&b", '"q"'],
                     ("torchrun", "--nnodes=1", "it's <train>.py"), versions={"torch": "2.13.0"})
    result.attempts = [Attempt(0, started_at=1.0, gang_formed_at=2.0, calls=(CallStart(0, 2.0),), first_output_at=3.0,
                               ended_at=9.0, stopped="node 1's task & <its> \"ranks\" lost", recorded_at=10.0),
                       Attempt(1, started_at=12.0, gang_formed_at=13.0, calls=(CallStart(0, 13.0),),
                               first_output_at=14.0, ended_at=20.0, stopped="rank 1 raised", recorded_at=21.0)]
    result.goodput = goodput.ledger(result.attempts, now=21.0)
    result.stacks = {1: 'Current thread 0x1 (most recent call first):\n  File "/w/it\'s.py", line 3 in <module>\n'}
    result.gang = records.gang({"reports": {"0": {"ranks": [vars(r) for r in result.ranks],
                                                  "tails": {"1": {"stdout": ["can't & won't <stop>"]}}}}})
    return result


def test_no_entity_shows_as_typed_anywhere_in_the_card(task):
    """Was: the What ran table's "node 0&#x27;s torchrun command", escaped for
    an HTML block though a table cell is drawn as text (issue 52)."""
    assert card_life.finish_card(task.deco, _full_card_result(), FLOW, NONE, 1)
    seen = _visible(_components(_card(task).get()))
    shown = [(text, m.group(0)) for text in seen for m in _ENTITY.finditer(text)]
    assert not shown, shown
    joined = "\n".join(seen)
    for text in ("node 0's torchrun command", "it's <train>.py", "--name a&b \"q\"", "can't parse <x> & \"y\"",
                 "node 1's task & <its> \"ranks\" lost", "can't & won't <stop>"):
        assert text in joined, text


def test_a_metric_or_host_in_the_progress_table_is_text_not_a_code_span(task):
    """A table cell shows a code span's backticks as typed."""
    from test_gang_progress import _book, _node

    book = _book(nodes=2, window=0.0)
    book.update(0, "h0", _node(2.0, **{"train_loss": 0.5}))
    book.update(1, "ip-10_0_0_1", _node(0.5))
    book.check(0.0)
    result = _result(succeeded=True)
    result.progress = book.summary
    assert card_life.finish_card(task.deco, result, FLOW, NONE, 0)
    cells = [c for p in _components(_card(task).get()) if p["type"] == "table" for row in p["data"] for c in row]
    assert "train_loss" in cells and any("(ip-10_0_0_1," in c for c in cells)
    assert not any("`" in c for c in cells), cells


# -- A hang's suspects ----------------------------------------------------------

def _hang(culprits):
    result = _result(succeeded=False)
    result.cause = records.cause({"kind": "hang", "summary": "no rank wrote a line for 20 s (hang_timeout=20s)"})
    result.culprits = culprits
    return result


CULPRITS = Culprits("all_reduce", (0, 1, 2), (Suspect(3, 1, "host-b", "skip.py:12 in <module>",
                                                      "its last was barrier #1 (completed)"),),
                    signal=FLIGHT_RECORDER, group="0", seq=2)


def test_a_hangs_suspected_cause_is_on_the_card_as_on_the_console(task):
    assert card_life.finish_card(task.deco, _hang(CULPRITS), FLOW, NONE, 0)
    sources = [p["source"] for p in _components(_card(task).get()) if p["type"] == "markdown"]
    head = CULPRITS.lines()[0]
    assert head.startswith("Suspected cause: rank 3 is not in the all_reduce #2 of process group 0")
    status = html.unescape(sources[0])
    # The head ends with a colon: the first suspect follows it there, not a bare colon.
    assert "<strong>Suspected cause</strong>: " + head.split(": ", 1)[1] + " " + CULPRITS.lines()[1].strip() in status, status
    root = html.unescape([s for s in sources if s.startswith("## Root cause")][0])
    for line in CULPRITS.lines():  # the suspect by rank, node, host and place, as the console says it
        assert line in root, (line, root)


def test_the_record_keeps_the_suspects_typed_and_writes_them_as_before():
    result = _hang(CULPRITS)
    assert result.to_dict()["culprits"] == CULPRITS.to_wire()
    assert _hang(None).to_dict()["culprits"] == {}


def test_a_failed_rank_is_named_by_its_error_not_as_a_suspect(task):
    """As on the console (record/result.suspected): a rank that raised is
    the cause, so no rank waiting is called suspect."""
    result = _hang(CULPRITS)
    result.cause = records.cause({"kind": "failed", "summary": "rank 3 raised: ValueError", "rank": 3})
    assert card_life.finish_card(task.deco, result, FLOW, NONE, 0)
    assert not any("Suspected cause" in p.get("source", "") for p in _components(_card(task).get()))


def test_why_no_suspect_was_named_is_one_line_of_the_root_cause_and_kept_in_the_record(task):
    """No culprit, and some ranks' Flight Recorder unsupported: the reason
    (runtime/call_stacks.py) is the Root cause's one line, and the record's field."""
    result = _hang(None)
    result.flight_unread = "this torch has no _dump_nccl_trace_json on ranks 0-7"
    assert result.to_dict()["flight_unread"] == result.flight_unread
    assert card_life.finish_card(task.deco, result, FLOW, NONE, 0)
    sources = [p["source"] for p in _components(_card(task).get()) if p["type"] == "markdown"]
    root = html.unescape([s for s in sources if s.startswith("## Root cause")][0])
    assert ("No suspect named: torch's Flight Recorder could not say (%s)" % result.flight_unread) in root, root
    assert root.count("Flight Recorder") == 1


# -- The Attempts and Goodput tables --------------------------------------------

def test_the_attempts_and_goodput_tables_agree_on_each_failures_cost():
    """Attempt 0: its call started at 2 s, its first line at 5.3 s (start-up),
    it failed at 12 s and its record came at 13 s; attempt 1 started at 14 s,
    its first line at 17 s. Was: work lost 10.0 s (from the call's start)
    against the ledger's 6.7 s (from the first line)."""
    attempts = with_costs([
        Attempt(0, started_at=0.0, gang_formed_at=1.0, calls=(CallStart(0, 2.0),), first_output_at=5.3,
                ended_at=12.0, stopped="node 1 lost", recorded_at=13.0),
        Attempt(1, started_at=14.0, gang_formed_at=15.0, calls=(CallStart(0, 15.5),), first_output_at=17.0,
                ended_at=30.0, stopped="succeeded", recorded_at=31.0)])
    led = goodput.ledger(attempts, now=31.0)
    first, second = led.segments
    assert round(attempts[0].lost_work_seconds, 3) == round(first.parts["lost_work"], 3) == 6.7
    # From the failure to the next attempt's first line: the ledger's stop and restart, both attempts'.
    back = first.parts["stop"] + first.parts["restart"] + second.parts["restart"]
    assert round(attempts[0].restart_seconds, 3) == round(back, 3) == round(first.time_to_restart, 3) == 5.0
    rows = card_content.attempt_rows(_with(attempts, led))
    assert rows[0][card_content.ATTEMPT_HEADERS.index("lost work")] == "6.7 s"
    goodput_row = goodput.rows(led)[0]
    assert goodput_row[goodput.HEADERS.index("lost work (s)")] == "6.7"


def _with(attempts, led):
    result = _result(succeeded=True)
    result.attempts, result.goodput = attempts, led
    return result


def test_each_attempts_record_names_its_card_and_the_attempts_table_shows_it(task):
    """From the last attempt's card, every earlier attempt's card can be
    opened: its record keeps its card's hash, the Attempts table shows it."""
    assert card_life.this_card_hash() == task.deco._card_uuid
    earlier = Attempt(0, started_at=1.0, calls=(CallStart(0, 2.0),), ended_at=9.0, stopped="node 1 lost",
                      card="0123456789abcdef0123456789abcdef")
    assert Attempt.from_wire(earlier.to_wire()).card == earlier.card
    result = _result(succeeded=True)
    result.attempts = with_costs([earlier, Attempt(1, started_at=12.0, calls=(CallStart(0, 13.0),), ended_at=20.0,
                                                   stopped="succeeded", card=task.deco._card_uuid)])
    rows = card_content.attempt_rows(result)
    column = card_content.ATTEMPT_HEADERS.index("card (--hash)")
    assert [r[column] for r in rows] == ["0123456789ab", task.deco._card_uuid[:card_content.CARD_HASH_SHOWN]]
