"""See the gang: rank-labelled logs, the result record, join progress, the card."""

import base64
import json
import os
import re
import signal
import threading
import time

import pytest
from our_processes import AGENT_MODULE

from .calls import MANY_LINES, flow_run, once_per_pytest_run
from .helpers import Gang, output

pytestmark = pytest.mark.integration

LINE = re.compile(r"^\[rank(\d)\]: LINE (\d) (\d+) payload-(x*)$")


def _control_log(gang, stream="stdout"):
    """The control task's log as ``Task.stdout`` gives it, but read as bytes: in
    calls_run another call's ranks print bytes that are not UTF-8, which
    ``Task.stdout`` cannot decode (Metaflow's client raises UnicodeDecodeError)."""
    return gang.client(
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = ''.join(m.decode(errors='replace') + '\\n' for _, m in t.loglines(%r, as_unicode=False))"
        % stream
    )


def test_every_line_of_every_rank_arrives_labelled_and_whole(calls_run):
    # The call "many_lines" of calls.CALLS, the one call of the run that prints LINE and ERRLINE.
    n = MANY_LINES  # 8,000 lines a rank, about 300 kB: far past a pipe's buffer
    gang = calls_run.gang
    assert calls_run.returncode == 0, calls_run.text[-3000:]
    seen = {r: set() for r in range(4)}
    for line in _control_log(gang).splitlines():
        if "LINE" not in line:
            continue
        m = LINE.match(line)
        assert m, "split or merged line: %r" % line[:200]
        label, writer, i, xs = m.groups()
        assert label == writer and len(xs) == int(i) % 37
        seen[int(label)].add(int(i))
    for r in range(4):
        assert len(seen[r]) == n, "rank %d: %d of %d lines" % (r, len(seen[r]), n)
    errs = _control_log(gang, "stderr")
    for r in range(4):
        assert "[rank%d]: ERRLINE %d done" % (r, r) in errs


@pytest.fixture(scope="module")
def unlabelled_run(tmp_path_factory):
    """many_lines.py, 30 lines a rank, with @torchrun(label_logs=False), read by
    test_labels_can_be_turned_off and test_card_shows_topology_ranks_and_timeline
    (the card is built from the ranks' own log files and the record, never from
    the labelled console: label_logs does not reach it), one flow for both."""
    kept = once_per_pytest_run(tmp_path_factory, "unlabelled", lambda: flow_run(
        tmp_path_factory, "unlabelled", "--script", "many_lines.py", "--script-args", json.dumps({"lines": 30}),
        env={"MFTR_TORCHRUN_ATTRS": json.dumps({"label_logs": False})}))
    return Gang(kept["tmp"]), kept["returncode"], kept["text"]


def test_labels_can_be_turned_off(unlabelled_run):
    gang, returncode, text = unlabelled_run
    assert returncode == 0, text[-3000:]
    log = _control_log(gang)
    assert "LINE 3 29 payload-" in log
    assert "[rank" not in log


def test_result_record_is_returned_and_stored_as_metadata(calls_run):
    # The step's last call's record (calls.CALLS' "report": report.py, 2 x 2) is the task's.
    assert calls_run.returncode == 0, calls_run.text[-3000:]
    record = calls_run.gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )
    assert record["succeeded"] and record["exit_code"] == 0
    assert record["node_index"] == 0 and record["num_nodes"] == 2
    assert AGENT_MODULE in record["command"]  # runs torchrun
    assert sorted(r["rank"] for r in record["ranks"]) == [0, 1] or len(record["ranks"]) == 2
    assert all(r["exit_code"] == 0 and r["duration"] > 0 for r in record["ranks"])
    # The control saw the whole gang: every node's ranks.
    reported = [r["rank"] for rep in record["gang"]["reports"].values() for r in rep["ranks"]]
    assert sorted(reported) == [0, 1, 2, 3]
    assert record["log_dir"] and record["restarts"] == 0


def test_failed_run_keeps_its_record_with_the_root_cause(failed_run):
    assert failed_run.proc.returncode != 0
    # The debug channel is off unless asked for (test_the_debug_channel_...).
    assert "metaflow_torchrun." not in failed_run.text, failed_run.text[-3000:]
    record = failed_run.gang.client(
        "import json\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )
    assert not record["succeeded"]
    assert "boom from rank 2" in record["cause"]["summary"]


_WAITING = re.compile(r"call 1 of current.torch.run \(report.py\): waiting for node 1 to reach it for (\d+) s")


def test_control_reports_who_is_missing_at_a_call(gang):
    """Node 1 joins, then reaches call 1 only once the control has said three
    times that the call waits for it (the test then creates MFTR_SKIP_UNTIL's
    file). What is said depends on no timeout, however loaded the machine: the
    test once ended at start_timeout=9, which under CI's load node 1 had not
    even joined by (its task took longer than that to start)."""
    release = os.path.join(gang.tmp, "node-1-goes-on")
    gang.env.update(
        {
            "MFTR_TORCHRUN_ATTRS": json.dumps({"start_timeout": 120}),  # a bound for a broken run, not reached
            "MFTR_SKIP_NODE": "1",
            "MFTR_SKIP_UNTIL": release,
            "METAFLOW_TORCHRUN_PROGRESS_SECONDS": "2",
        }
    )
    proc = gang.start("--script", "report.py")
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while len(_WAITING.findall(b"".join(list(lines)).decode(errors="replace"))) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, b"".join(lines).decode(errors="replace")[-3000:]
            time.sleep(0.2)
        open(release, "w").close()
        proc.wait(timeout=180)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = b"".join(lines).decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    waits = [int(w) for w in _WAITING.findall(text)]
    # In order, and calm: one every 2 s at most (a late wake-up only spaces
    # them more), not one per heartbeat.
    assert waits == sorted(set(waits)), waits
    assert len(waits) <= (waits[-1] - waits[0] + 1) / 2 + 1, waits
    # Once node 1 is there, that is said, and the waiting is no longer.
    assert "@torchrun: all 2 nodes are there" in text[text.rindex("to reach it for"):], text[-3000:]


def _card_components(gang, flow="gang_flow.py"):
    pathspec = gang.client(
        "result = Flow('GangFlow').latest_run['train'].control_task.pathspec"
    )
    import os
    import subprocess
    import sys

    from .helpers import FLOWS

    html = os.path.join(gang.tmp, "card.html")
    proc = subprocess.run(
        [sys.executable, os.path.join(FLOWS, flow), "--no-pylint", "card", "get",
         pathspec.split("/", 1)[1], html, "--id", "torchrun"],
        cwd=gang.tmp, env=gang.env, capture_output=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    text = open(html).read()
    # Offline: no script or stylesheet is fetched from anywhere.
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", text)
    data = re.search(r'__MF_DATA__\["[^"]+"\] = "([^"]+)"', text).group(1)
    page = json.loads(base64.b64decode(data))
    return page["components"][0]["contents"][0]["contents"]


def _card_creates(gang):
    """The `flow.py card create` subprocesses Metaflow ran (gang_flow.py logs them)."""
    import os

    try:
        with open(os.path.join(gang.out, "card-create.log")) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _client_card(gang):
    """The control task's card as the Metaflow client finds it."""
    return gang.client(
        "from metaflow.cards import get_cards\n"
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "cards = get_cards(t, id='torchrun')\n"
        "info = [json.loads(m.value) for m in t.metadata if m.type == 'card-info']\n"
        "result = {'n': len(cards), 'type': cards[0].type, 'id': cards[0].id, 'hash': cards[0].hash,\n"
        "          'html': cards[0].get(), 'data': cards[0].get_data(), 'info': info}"
    )


def test_card_shows_topology_ranks_and_timeline(unlabelled_run):
    gang, returncode, text = unlabelled_run
    assert returncode == 0, text[-3000:]
    # Rendered in the task, not by `card create`, and found by the client as Metaflow's own.
    card = _client_card(gang)
    assert (card["n"], card["type"], card["id"]) == (1, "blank", "torchrun")
    assert "[METAFLOW_RELOAD_TOKEN]" not in card["html"]
    data = re.search(r'__MF_DATA__\["[^"]+"\] = "([^"]+)"', card["html"]).group(1)
    assert "gloo expected (the step asked for no GPU)" in base64.b64decode(data).decode()
    assert card["data"]["reload_token"] == "final"
    assert [(i["card_uuid"], i["id"], i["type"]) for i in card["info"]] == [(card["hash"], "torchrun", "blank")]
    assert _card_creates(gang) == []
    assert "rendering the card in the task failed" not in text
    parts = _card_components(gang)
    sources = [p.get("source", "").strip() for p in parts if p["type"] == "markdown"]
    tables = [p for p in parts if p["type"] == "table"]
    assert "Succeeded" in sources[0]
    # What ran first (issue 36): the entrypoint, its arguments, versions, each node's log folder.
    ran = dict(map(tuple, tables[0]["data"]))
    assert ran["entrypoint (script)"].endswith("/scripts/many_lines.py") and ran["arguments"] == "--lines 30"
    assert ran["log folder, node 1"].endswith("node-1") and "version of metaflow-torchrun" in ran
    topology = dict(map(tuple, tables[1]["data"]))
    assert topology["nodes x processes"] == "2 x 2"
    assert topology["control address"] == "127.0.0.1"
    chart = [p for p in parts if p["type"] == "vegaChart"][0]["spec"]
    bars = [layer for layer in chart["layer"] if layer["mark"]["type"] == "bar"][0]
    assert bars["encoding"]["y"]["sort"] == ["node 0", "node 1"] + ["rank %d (node %d)" % (r, r // 2) for r in range(4)]
    ranks = tables[2]["data"]
    assert sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3]
    assert all(r[4] == "0 (ok)" for r in ranks)
    tails = "\n".join(s for s in sources if s.startswith("**rank"))
    for r in range(4):
        assert "LINE %d 29 payload-" % r in tails


def test_card_of_a_failed_run_names_the_root_cause(failed_run):
    gang = failed_run.gang
    assert failed_run.proc.returncode != 0
    parts = _card_components(gang)
    sources = [p.get("source", "").strip() for p in parts if p["type"] == "markdown"]
    assert "Failed" in sources[0] and "boom from rank 2" in sources[0]
    assert any(s.startswith("## Root cause") and "rank 2" in s for s in sources)
    # Rendered in the task too, found by the client; `card get` above is no `card create`.
    assert _client_card(gang)["n"] == 1
    assert _card_creates(gang) == []


def _record(gang):
    return gang.client(
        "t = Flow('GangFlow').latest_run['train'].control_task\n"
        "result = json.loads(t.metadata_dict['torchrun-result'])"
    )


def test_card_every_rank_of_every_node_has_an_exit_and_a_duration_when_the_gang_stops_them(gang):
    """Node 1's first rank hangs in a collective; the gang stops every rank
    (SIGTERM from their agents): the control's own ranks and node 1's still get
    their exits and durations, in the record and on the card, and the chart
    marks the failure."""
    # stuck.py talks while its ranks import torch and meet (at 6 s, four silent
    # imports on a loaded machine ran past it); 10 s: torchrun's agent is silent at
    # its own start, before the script's first line (as in test_stops).
    gang.env["MFTR_TORCHRUN_ATTRS"] = json.dumps({"hang_timeout": 10})
    proc = gang.run("--script", "stuck.py", timeout=180)
    assert proc.returncode != 0 and "no output from any rank" in output(proc), output(proc)[-3000:]
    record = _record(gang)
    reports = record["gang"]["reports"]
    assert sorted(reports) == ["0", "1"]
    ranks = [r for rep in reports.values() for r in rep["ranks"]]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    with open(os.path.join(gang.out, "stuck.json")) as f:
        stuck = json.load(f)["rank"]
    for r in ranks + record["ranks"]:
        # Stopped by SIGTERM, not "unknown". The stuck rank waits in an all-reduce: where the other node's
        # ranks are stopped first (under load, by a few hundred ms), gloo raises there and it exits 1 first.
        allowed = (-15, 1) if r["rank"] == stuck else (-15,)
        assert r["exit_code"] in allowed and r["end"] > r["start"] > 0, r
    assert sorted(record["gang"]["finished_at"]) == ["0", "1"]
    parts = _card_components(gang)
    table = [p for p in parts if p["type"] == "table" and p["columns"][:1] == ["rank"]][0]["data"]
    assert sorted(int(row[0]) for row in table) == [0, 1, 2, 3]
    for row in table:
        said = ("killed by signal SIGTERM", "exit code 1") if int(row[0]) == stuck else ("killed by signal SIGTERM",)
        assert row[4] in said and re.fullmatch(r"\d+\.\d s", row[5]), row
    chart = [p for p in parts if p["type"] == "vegaChart"][0]["spec"]
    failure = [layer for layer in chart["layer"] if layer["mark"]["type"] == "rule"][-1]
    assert failure["data"]["values"][0]["label"] == "gang stopped: hang"
    lanes = [layer for layer in chart["layer"] if layer["mark"]["type"] == "bar"][0]["data"]["values"]
    states = [row["state"] for row in lanes if row["lane"].startswith("rank")]
    assert len(states) == 4 and states.count("rank: stopped") >= 3 and set(states) <= {"rank: stopped", "rank: failed"}


def test_card_a_ranks_5000_character_line_never_widens_the_page(gang):
    proc = gang.run("--script", "long_line.py", "--script-args", json.dumps({"rank": 1}), "--nproc", "1", timeout=180)
    assert proc.returncode != 0, output(proc)[-3000:]
    parts = _card_components(gang)
    sources = [p.get("source", "") for p in parts if p["type"] == "markdown"]
    cells = [cell for p in parts if p["type"] == "table" for row in p["data"] for cell in row]
    outside = [re.sub(r"<pre[^>]*>.*?</pre>", "", s, flags=re.S) for s in sources]
    for text in cells + outside:
        longest = max((len(w) for w in re.findall(r"[^\s\u200b]+", text.replace("\\", ""))), default=0)
        assert longest <= 80, text[:300]  # the browser can break it: it wraps
    blocks = [b for s in sources for b in re.findall(r"<pre[^>]*>.*?</pre>", s, re.S)]
    assert blocks and all(b.startswith('<pre style="white-space: pre-wrap;') for b in blocks)
    # Every line is cut where it is shown, saying how long it was; the rank's log has it whole.
    assert max(len(line) for b in blocks for line in b.split("&#10;")) < 1200
    tails = "\n".join(s for s in sources if s.lstrip().startswith("**rank"))
    for r in range(2):
        assert "short line from rank %d" % r in tails
    assert tails.count("[5000 characters in all]") >= 2
    assert any("rank-N.stdout.log" in s for s in sources)
    assert "Failed" in sources[0] and "more characters]" in sources[0].replace("\\", "")
    record = _record(gang)
    log = os.path.join(record["log_dir"], "rank-0.stdout.log")
    with open(log) as f:
        assert "L" * 5000 in f.read()  # the whole line, where the card says it is


# A debug line as host/log.py writes it: time to the millisecond, logger, pid.
DEBUG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} metaflow_torchrun\.([a-z_.]+)\[\d+\] debug: (.*)$")


def test_the_debug_channel_shows_the_gang_and_its_timing(gang):
    """METAFLOW_TORCHRUN_DEBUG=1; without it, no such line
    (test_failed_run_keeps_its_record_with_the_root_cause)."""
    proc = gang.run("--script", "fail.py", "--script-args", json.dumps({"rank": 1}), "--nproc", "1",
                    timeout=180, env={"METAFLOW_TORCHRUN_DEBUG": "1"})
    text = output(proc)
    assert proc.returncode != 0 and "boom from rank 1" in text, text[-3000:]
    found = [m.groups() for m in map(DEBUG_LINE.search, text.splitlines()) if m]
    said = "\n".join("%s: %s" % pair for pair in found)
    for logger, what in [
        ("gang.server", "node 1 joined from "),
        ("gang.client", "node 1: joined the gang at "),
        ("gang.client", "node 0: call 0 entered"),
        ("gang.server", "call 0: go to node 1 (rendezvous port "),
        ("gang.client", "node 1: call 0: go (rendezvous port "),
        ("runtime.supervisor", "torchrun's agent started: pid "),
        ("runtime.session", "node 1: call 0: begun"),
        ("gang.client", "node 1: failure reported (call 0): failed: "),
        ("gang.server", "failure seen from node 1: failed: "),
        ("gang.server", "verdict: failed (node 1): "),
        ("gang.client", "node 0: the gang's verdict: failed: "),
        ("runtime.session", "node 0: call 0: ended after "),
        # Node 1's own line: the control's service closes once every node heard the verdict
        # (runtime/session.py, linger), which can be before node 1's leave reaches it.
        ("gang.client", "node 1: left after 1 calls (failed)"),
        ("runtime.session", "node 0: closing the gang (the control lingers after a failure): ended after "),
    ]:
        assert "%s: %s" % (logger, what) in said, "%s: %s\nnot in:\n%s" % (logger, what, said)
    # Node 0's agent is stopped (its stop timed), unless its rank 0, in an
    # all_reduce with rank 1, saw the connection close and ended first: gloo and
    # the verdict race (seen in CI: two "agent ended" lines, no stop to time).
    stopped = "runtime.supervisor: stop begun after " in said and "runtime.supervisor: stop ended in " in said
    assert stopped or said.count("runtime.supervisor: torchrun's agent ended with ") == 2, said
