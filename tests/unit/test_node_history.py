"""Node roles and the node history (record/node_roles.py, node_history.py):
who is blamed for a cause, bounded entries, the K-of-M flag with its
evidence, strict refusal, bandwidth against a host's own past, steering."""

import json
import re
from dataclasses import replace

from metaflow_extensions.torchrun.plugins.torchrun.cause import Cause, CauseKind
from metaflow_extensions.torchrun.plugins.torchrun.record import node_history as nh
from metaflow_extensions.torchrun.plugins.torchrun.record import node_roles as roles
from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import Attempt


def test_roles_follow_the_cause():
    assert roles.blamed_nodes(Cause(CauseKind.RANK_FAILED, "x", node_index=3), False) == {3: "culprit"}
    assert roles.blamed_nodes(Cause(CauseKind.NODE_LOST, "x", node_index=1), False) == {1: "lost"}
    assert roles.blamed_nodes(Cause(CauseKind.UNRESPONSIVE, "x", node_index=1, missing=(1, 2)), False) == {
        1: "frozen", 2: "frozen"}
    # The user's own exception, a preemption, an echo: nobody's node.
    assert roles.blamed_nodes(Cause(CauseKind.RANK_FAILED, "x", node_index=3), True) == {}
    assert roles.blamed_nodes(Cause(CauseKind.PREEMPTED, "x", node_index=3), False) == {}
    assert roles.blamed_nodes(Cause(CauseKind.RANK_FAILED, "x", node_index=3, secondary=True), False) == {}


def test_entries_are_bounded_at_a_thousand_nodes():
    n = roles.MAX_NODES + 500
    entries, left_out = roles.entries(n, {i: "h%d" % i for i in range(n)}, {7: "culprit"}, {9: 2.5}, {}, {},
                                      tasks=["r/s/t%d" % i for i in range(n)])
    assert left_out == n - 2 and [e.role for e in entries] == ["culprit", "slow"]
    assert entries[0].task == "t7" and entries[1].ratio == 2.5
    small, none_out = roles.entries(3, {0: "a"}, {}, {}, {1: 4.0}, {2: "shm"})
    assert none_out == 0 and [e.host for e in small] == ["a", "?", "?"] and small[1].link_gbps == 4.0


def test_stragglers_read_the_progress_section_when_present():
    from metaflow_extensions.torchrun.plugins.torchrun.gang.gang_progress import ProgressRecord, Straggler

    progress = ProgressRecord(stragglers=(Straggler(2, "h", "4", 1.8, 3.0, "progress"),))
    assert roles.stragglers(progress) == {2: 1.8}
    assert roles.stragglers(None) == {}


def test_entries_round_trip_and_hostile_ones_are_dropped():
    e = roles.NodeEntry(node=1, host="h", role="culprit", link_gbps=3.0, task="7")
    assert roles.NodeEntry.from_wire(e.to_wire()) == e
    for bad in ({"node": -1, "role": "culprit"}, {"node": 1, "role": "villain"}, {"node": True, "role": "lost"}, 3):
        assert roles.NodeEntry.from_wire(bad) is None


def _attempt(k, at, hosts, blamed=None, stopped="node 1 (h), rank 1: killed by signal SIGSEGV", links=None):
    nodes = tuple(roles.NodeEntry(node=i, host=h, role=(blamed or {}).get(i, "bystander"),
                                  link_gbps=(links or {}).get(i)) for i, h in enumerate(hosts))
    return Attempt(attempt=k, started_at=at, stopped=stopped, kind=CauseKind.RANK_FAILED, nodes=nodes)


def _seen(bad_runs=3, ok_runs=0):
    seen = []
    for r in range(bad_runs):
        seen += nh.appearances([_attempt(0, 100.0 + r, ["good", "bad"], {1: "culprit"})], "F", str(r), "train")
    for r in range(ok_runs):
        seen += nh.appearances([_attempt(0, 200.0 + r, ["good", "bad"], stopped="succeeded")], "F", "ok%d" % r,
                               "train")
    return seen


def test_the_history_names_the_host_and_the_cause_that_recurred():
    report = nh.report(_seen())
    assert report["runs"] == 3 and report["hosts"][0]["host"] == "bad" and report["hosts"][0]["blamed"] == 3
    assert report["hosts"][1] == dict(report["hosts"][1], host="good", blamed=0, appearances=3)
    assert report["causes"] == [{"cause": "node N (h), rank N: killed by signal SIGSEGV", "times": 3,
                                 "hosts": ["bad"]}]


def test_k_of_m_flags_with_evidence_and_a_non_default_threshold():
    seen = _seen(bad_runs=2, ok_runs=3)
    # Defaults (2 of the last 5): the two failures are within the window.
    assert "bad was blamed in 2 of its last 5 appearances: 1/train attempt 0 (culprit: " in nh.evidence(
        "bad", seen, nh.Threshold())
    # 2 of the last 3: the three newer successes push them out.
    assert nh.evidence("bad", seen, nh.Threshold(2, 3)) is None
    assert nh.evidence("good", seen, nh.Threshold(1, 5)) is None


def test_warn_or_refuse_under_strict():
    lines, cause = nh.check({0: "good", 1: "bad"}, _seen(), nh.Threshold(), strict=False, platform="local")
    assert cause is None and lines[0].startswith("node 1: bad was blamed in 3 of its last 3 appearances")
    assert 'preflight="strict" would' in lines[0]
    lines, cause = nh.check({0: "good", 1: "bad"}, _seen(), nh.Threshold(), strict=True, platform="batch")
    assert cause.kind is CauseKind.PREFLIGHT and cause.node_index == 1 and "bad was blamed in 3" in cause.summary
    assert "AWS Batch offers a job no way to avoid an instance" in lines[0]
    assert nh.check({0: "good"}, _seen(), None, strict=True, platform="local") == ([], None)


def test_kubernetes_steering_names_the_node():
    text = nh.steering(["node 10.0.0.7"], "kubernetes")
    assert "10.0.0.7" in text and "NoSchedule" in text and "cannot exclude a node" in text


def test_bandwidth_below_its_own_past():
    seen = []
    for r, gbps in enumerate((10.0, 12.0, 11.0)):
        seen += nh.appearances([_attempt(0, r, ["a"], stopped="succeeded", links={0: gbps})], "F", str(r), "t")
    assert "a measured 2 GB/s, under 50% of its own median 11 GB/s over 3 past runs" in nh.slower_than_its_past(
        "a", 2.0, seen)
    assert nh.slower_than_its_past("a", 9.0, seen) is None
    assert nh.slower_than_its_past("a", 2.0, seen, fraction=0.1) is None


def test_an_attempts_record_round_trips_its_nodes_and_the_table_reads_it():
    from metaflow_extensions.torchrun.plugins.torchrun import cli

    wire = {"attempts": [_attempt(0, 5.0, ["good", "bad"], {1: "lost"}).to_wire()]}
    (attempt,) = nh.record_attempts(json.dumps(wire))
    assert [(n.host, n.role) for n in attempt.nodes] == [("good", "bystander"), ("bad", "lost")]
    assert nh.record_attempts("not json") == [] and nh.record_attempts('{"attempts": 3}') == []
    lines = cli.table(nh.report(_seen()))
    assert lines[0] == "3 runs, 3 attempts, 2 hosts"
    assert lines[3].split()[:4] == ["bad", "3", "3", "0"]
    assert any("3x  node N (h), rank N: killed by signal SIGSEGV  (host: bad)" in line for line in lines)


TORCH_ECHO = ("node 1 (h), rank 1: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
              "closed by peer [127.0.0.1]:30171. This is typically caused by a remote peer having exited")


def test_one_failure_in_one_run_reads_in_the_singular_and_is_not_said_to_recur():
    from metaflow_extensions.torchrun.plugins.torchrun import cli

    seen = nh.appearances([_attempt(0, 5.0, ["bad"], {0: "culprit"}, stopped=TORCH_ECHO)], "F", "1", "train")
    lines = cli.table(nh.report(seen))
    assert lines[0] == "1 run, 1 attempt, 1 host"
    assert not any("recurred" in line for line in lines), lines
    (title, cause) = lines[lines.index("causes seen once (blamed attempts):"):][:2]
    assert cause.startswith("  1x  node N (h), rank N: RuntimeError: ") and cause.endswith("  (host: bad)")
    # Cut where a word ends, never inside one ("caused by a r…").
    whole = re.sub(r"\d+", "N", TORCH_ECHO)
    shown = cause.split("  ")[2]
    assert shown.endswith("…") and whole.startswith(shown[:-1]) and whole[len(shown) - 1] == " "
    key, whole = nh.cause_key(TORCH_ECHO), re.sub(r"\d+(\.\d+)?", "N", TORCH_ECHO)
    assert len(key) <= 120 and key.endswith("…") and whole.startswith(key[:-1]) and whole[len(key) - 1] == " "


def test_causes_that_recur_and_causes_seen_once_are_told_apart():
    from metaflow_extensions.torchrun.plugins.torchrun import cli

    seen = _seen(bad_runs=2) + nh.appearances(
        [_attempt(0, 9.0, ["good", "bad"], {0: "lost"}, stopped="node 0 (good) stopped answering")], "F", "x", "train")
    lines = cli.table(nh.report(seen))
    assert lines[0] == "3 runs, 3 attempts, 2 hosts"
    recurred = lines.index("causes that recurred (blamed attempts):")
    once = lines.index("causes seen once (blamed attempts):")
    assert "2x  node N (h), rank N: killed by signal SIGSEGV  (host: bad)" in lines[recurred + 1]
    assert lines[once + 1] == "  1x  node N (good) stopped answering  (host: good)"


def _swapped(k, at, hosts=("good", "bad", "spare")):
    """An attempt that succeeded after node 1 was taken out for the spare node 2."""
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import RestartMark

    nodes, _ = roles.entries(3, dict(enumerate(hosts)), {}, {}, {}, {}, tasks=["r/train/t%d" % i for i in range(3)],
                             taken_out=[1])
    swap = RestartMark(call=0, restart=1, failed_at=at + 5, stopped="node 1 (bad), rank 1: killed by signal SIGKILL",
                       kind=CauseKind.RANK_FAILED, swapped_out=1, swapped_in=2, out_host="bad", in_host="spare")
    return Attempt(attempt=k, started_at=at, stopped="succeeded", nodes=nodes, restarts=(swap,))


def test_a_host_taken_out_for_a_spare_counts_as_a_failure_pinned_to_it():
    attempt = _swapped(0, 100.0)
    assert [(n.node, n.role, n.task) for n in attempt.nodes] == [(0, "bystander", None), (1, "out", "t1"),
                                                                 (2, "bystander", None)]
    seen = nh.appearances([attempt], "F", "1", "train")
    bad = [a for a in seen if a.host == "bad"][0]
    assert bad.role == "out"
    assert bad.cause == "taken out for a spare: node 1 (bad), rank 1: killed by signal SIGKILL"
    assert all(a.cause is None for a in seen if a.host != "bad")
    # Swapped out in 3 runs: a later run's preflight names it and, with spares, starts it as a spare.
    seen = [a for r in range(3) for a in nh.appearances([_swapped(0, 100.0 + r)], "F", str(r), "train")]
    threshold = nh.Threshold(culprit=3, appearances=5)
    assert nh.evidence("bad", seen, threshold).startswith("bad was blamed in 3 of its last 3 appearances")
    assert nh.blamed({0: "good", 1: "spare", 2: "bad"}, seen, threshold) == [2]
    report = nh.report(seen)
    assert report["hosts"][0]["host"] == "bad" and report["hosts"][0]["roles"] == {"out": 3}


def test_a_node_the_preflight_took_out_is_blamed_for_its_checks():
    nodes, _ = roles.entries(2, {0: "a", 1: "b"}, {}, {}, {}, {1: "shm"}, taken_out=[1])
    (appearance,) = [a for a in nh.appearances([Attempt(attempt=0, started_at=1.0, stopped="succeeded", nodes=nodes)],
                                               "F", "1", "train") if a.host == "b"]
    assert appearance.role == "out"
    assert appearance.cause == "taken out for a spare before any rank started: preflight shm"
    assert roles.NodeEntry.from_wire(nodes[1].to_wire()) == nodes[1]


# -- what is blamed is what failed: a local run's nodes share one host --------------------------------------------

def _local_swap(at, run):
    """A local run (every node on "vm") whose node 1 was taken out for the spare node 2."""
    return nh.appearances([_swapped(0, at, hosts=("vm", "vm", "vm"))], "F", run, "train")


def test_a_local_runs_nodes_are_told_apart_on_their_shared_host_and_never_checked():
    """History shows which node of a shared host failed; the preflight of a local run checks none of the
    nodes that share this machine: an index names no machine. Was: node 1, killed twice in test runs, was
    named in a long warning on every later run and started as the spare."""
    seen = _local_swap(100.0, "1") + _local_swap(101.0, "2")
    assert sorted((a.key, a.role) for a in seen if a.run == "1") == [
        ("vm (node 0)", "bystander"), ("vm (node 1)", "out"), ("vm (node 2)", "bystander")]
    local = {0: "vm", 1: "vm", 2: "vm"}
    assert nh.check(local, seen, nh.Threshold(), strict=False, platform="local") == ([], None)
    assert nh.check(local, seen, nh.Threshold(), strict=True, platform="local") == ([], None)
    assert nh.blamed(local, seen, nh.Threshold(), "local") == []
    assert nh.node_keys(local, "local") == {} and nh.node_keys(local, "kubernetes") == local
    # A node of the local run that reports a host of its own (a named test host) is still its host.
    assert nh.node_keys({0: "vm", 1: "vm", 2: "bad"}, "local") == {2: "bad"}
    report = nh.report(seen)
    assert [(h["host"], h["blamed"]) for h in report["hosts"]] == [
        ("vm (node 1)", 2), ("vm (node 0)", 0), ("vm (node 2)", 0)]
    assert report["causes"][0]["hosts"] == ["vm (node 1)"]


def test_a_single_node_local_runs_failures_are_not_every_nodes_of_a_later_gang():
    alone = [a for r in range(3) for a in nh.appearances(
        [_attempt(0, 100.0 + r, ["vm"], {0: "culprit"})], "F", str(r), "train")]
    assert {a.key for a in alone} == {"vm"}
    assert nh.blamed({0: "vm", 1: "vm"}, alone, nh.Threshold(), "local") == []
    assert nh.blamed({0: "vm"}, alone, nh.Threshold(), "local") == [0]


def test_on_a_cluster_a_shared_host_is_one_machine():
    # Two pods on one Kubernetes node, twice; node 1's rank failed each time: the machine is bad for any pod.
    seen = [a for r in range(2) for a in nh.appearances(
        [_attempt(0, 100.0 + r, ["node 10.0.0.1", "node 10.0.0.1", "node 10.0.0.2"], {1: "culprit"})],
        "F", str(r), "train")]
    hosts = {0: "node 10.0.0.1", 1: "node 10.0.0.2", 2: "node 10.0.0.1"}
    assert nh.blamed(hosts, seen, nh.Threshold(), "kubernetes") == [0, 2]
    lines, _ = nh.check(hosts, seen, nh.Threshold(), strict=False, platform="kubernetes")
    # One appearance per attempt for the machine, however many of its pods the attempt had.
    assert lines[0].startswith("nodes 0, 2: node 10.0.0.1 was blamed in 2 of its last 2 appearances")
    assert "kubectl taint" in lines[1] and "10.0.0.1" in lines[1]
    machines = nh.as_machines(seen)
    assert sorted((a.key, a.role) for a in machines if a.run == "0") == [
        ("node 10.0.0.1", "culprit"), ("node 10.0.0.2", "bystander")]


def _restarted(k, at, hosts, stopped, kind=CauseKind.RANK_FAILED, stopped_after="succeeded", blamed=None):
    """An attempt whose ranks restarted in place once (no spare), for ``stopped``."""
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import RestartMark

    mark = RestartMark(call=0, restart=1, failed_at=at + 5, stopped=stopped, kind=kind)
    return replace(_attempt(k, at, hosts, blamed, stopped=stopped_after), restarts=(mark,))


def _killed(node, host):
    """A rank's SIGKILL on ``node``, in the words the gang's cause gives it (errors.failure_summary)."""
    from metaflow_extensions.torchrun.plugins.torchrun.errors import failure_summary
    from metaflow_extensions.torchrun.plugins.torchrun.procs.failures import RankFailure

    return failure_summary(RankFailure(rank=2 * node + 1, local_rank=1, node_index=node, host=host, pid=4242,
                                       exc_type="killed by signal SIGKILL", message="the process ended",
                                       traceback="", timestamp=1.0))


def test_a_restart_in_place_blames_the_node_its_cause_is_pinned_to():
    attempt = _restarted(0, 100.0, ["vm", "vm"], _killed(1, "vm"))
    assert nh.pinned_in_step(attempt) == {1: ("culprit", "restarted in place: " + _killed(1, "vm"))}
    seen = nh.appearances([attempt], "F", "1", "train")
    assert [(a.key, a.role) for a in seen] == [("vm (node 0)", "bystander"), ("vm (node 1)", "culprit")]
    assert seen[1].cause == "restarted in place: " + _killed(1, "vm")
    # On hosts of their own, the host; node 0 (never swapped: it holds the store) is blamed as well.
    seen = nh.appearances([_restarted(0, 100.0, ["a", "b"], _killed(0, "a"))], "F", "1", "train")
    assert [(a.key, a.role) for a in seen] == [("a", "culprit"), ("b", "bystander")]
    # torchrun's own exit, with no rank's record: its node still named first.
    ended = _restarted(0, 100.0, ["a", "b"], "node 1: torchrun ended with exit code 1")
    assert nh.pinned_in_step(ended) == {1: ("culprit", "restarted in place: node 1: torchrun ended with exit code 1")}
    report = nh.report([a for r in range(2) for a in nh.appearances(
        [_restarted(0, 100.0 + r, ["vm", "vm"], _killed(1, "vm"))], "F", str(r), "train")])
    assert report["hosts"][0] == dict(report["hosts"][0], host="vm (node 1)", blamed=2, roles={"culprit": 2})
    assert report["causes"][0]["cause"].startswith("restarted in place: node N (vm), rank N")


def test_a_restart_that_is_nobodys_blames_nobody_and_a_swap_is_counted_once():
    hang = _restarted(0, 100.0, ["vm", "vm"], "no rank wrote a line for 60s (hang_timeout)", kind=CauseKind.HANG)
    assert nh.pinned_in_step(hang) == {}
    assert {a.role for a in nh.appearances([hang], "F", "1", "train")} == {"bystander"}
    unknown = _restarted(0, 100.0, ["vm", "vm"], _killed(1, "vm"), kind=None)
    assert nh.pinned_in_step(unknown) == {}
    # A swap's node is taken out ("out"), once, not restarted in place as well.
    swapped = _swapped(0, 100.0, hosts=("vm", "vm", "vm"))
    assert nh.pinned_in_step(swapped) == {1: ("out", "taken out for a spare: node 1 (bad), rank 1: killed by signal "
                                                     "SIGKILL")}
    assert [a.role for a in nh.appearances([swapped], "F", "1", "train")] == ["bystander", "out", "bystander"]
    # An attempt that then failed on another node: both nodes blamed, each for its own cause.
    both = _restarted(0, 100.0, ["a", "b", "c"], _killed(1, "b"), stopped_after=_killed(2, "c"), blamed={2: "culprit"})
    seen = nh.appearances([both], "F", "1", "train")
    assert [(a.key, a.role) for a in seen] == [("a", "bystander"), ("b", "culprit"), ("c", "culprit")]
    assert seen[1].cause == "restarted in place: " + _killed(1, "b") and seen[2].cause == _killed(2, "c")


LOST = "node 1 (b) disconnected before its step ended: its task died or was killed"
FROZEN = "node 1 (b) sent no heartbeat for 31s (heartbeat_timeout=30s): frozen or cut off from the network"


def _in_step(kind, stopped, swapped_in=None, host="b"):
    """An attempt that succeeded after node 1 (on ``host``) was lost or froze mid-step: replaced by the spare
    node 2 (``swapped_in``), or the gang went on without it (or restarted it in place); in the end, node 1
    is a spare again or trains again (a bystander of how the attempt ended)."""
    from metaflow_extensions.torchrun.plugins.torchrun.record.attempts import RestartMark

    mark = RestartMark(call=0, restart=1, failed_at=105.0, stopped=stopped, kind=kind,
                       swapped_out=1 if swapped_in is not None else None, swapped_in=swapped_in)
    return replace(_attempt(0, 100.0, ["a", host, "c"], stopped="succeeded"), restarts=(mark,))


def test_a_lost_node_and_a_frozen_one_are_in_the_history_though_the_step_went_on():
    """Was: a node lost mid-step and back as a spare, or one restarted in place after it froze, was a
    bystander of an attempt that succeeded, and absent from `torchrun history`."""
    from metaflow_extensions.torchrun.plugins.torchrun import cli

    cases = [(_in_step(CauseKind.NODE_LOST, LOST, swapped_in=2), "lost", "taken out for a spare: " + LOST),
             (_in_step(CauseKind.NODE_LOST, LOST + "; the gang trains on without it, on 2 nodes"), "lost",
              LOST + "; the gang trains on without it, on 2 nodes"),
             (_in_step(CauseKind.UNRESPONSIVE, FROZEN), "frozen", "restarted in place: " + FROZEN),
             (_in_step(CauseKind.UNRESPONSIVE, FROZEN, swapped_in=2), "frozen", "taken out for a spare: " + FROZEN)]
    for attempt, role, why in cases:
        seen = nh.appearances([attempt], "F", "1", "train")
        assert [(a.host, a.role) for a in seen] == [("a", "bystander"), ("b", role), ("c", "bystander")], role
        assert seen[1].cause == why
    report = nh.report([a for r, (attempt, _, _) in enumerate(cases)
                        for a in nh.appearances([replace(attempt, started_at=100.0 + r)], "F", str(r), "train")])
    assert report["hosts"][0] == dict(report["hosts"][0], host="b", blamed=4, roles={"lost": 2, "frozen": 2})
    table = "\n".join(cli.table(report))
    assert "disconnected before its step ended" in table and "sent no heartbeat" in table, table


def test_a_hosts_causes_are_cut_once_each_their_counts_whole():
    """Was: the row's causes joined, then cut again: a cause already cut got a second ellipsis, and the next
    cause and its count were cut off mid-word."""
    from metaflow_extensions.torchrun.plugins.torchrun import cli
    from metaflow_extensions.torchrun.plugins.torchrun.base.text import ELLIPSIS

    timed_out = ("node 1 (bad), rank 1: RuntimeError: the collective timed out waiting for the peers of process "
                 "group default_pg_0000000000000000 to arrive")
    seen = [a for r in range(3) for a in nh.appearances(
        [_attempt(0, 100.0 + r, ["good", "bad"], {1: "culprit"}, stopped=timed_out if r < 2
                  else "node 1 (bad) rank 1: killed by signal SIGKILL while it wrote its snapshot to the store")],
        "F", str(r), "train")]
    row = next(line for line in cli.table(nh.report(seen)) if line.startswith("bad "))
    shown = row.split("  ")[-1]
    assert shown.count(ELLIPSIS) <= 1 and len(shown) <= cli.BLAMED_FOR, shown
    assert re.fullmatch(r".*\(\dx\)(; .*\(\dx\))?", shown), shown  # every cause shown keeps its count
    assert cli.blamed_for([("a" * 200 + ELLIPSIS, 3)]).endswith(ELLIPSIS + " (3x)")
    assert cli.blamed_for([("x " * 60 + ELLIPSIS, 2), ("y " * 60, 1)]).count(ELLIPSIS) == 1


def test_a_host_named_slow_twice_is_flagged_refused_under_strict_and_benched_with_spares():
    """The gang waited for it (a straggler, by arrival or by steps) in two of its last appearances."""
    seen = [nh.Appearance(host="slowpoke", flow="F", run=str(r), step="train", attempt=0, role="slow", at=100.0 + r)
            for r in range(2)] + [nh.Appearance(host="fine", flow="F", run=str(r), step="train", attempt=0,
                                                role="bystander", at=100.0 + r) for r in range(2)]
    assert nh.evidence("slowpoke", seen[:1], nh.Threshold()) is None  # once is not twice
    assert nh.evidence("slowpoke", seen, nh.Threshold()) == (
        "slowpoke was named slow in 2 of its last 2 appearances: 1/train attempt 0; 0/train attempt 0")
    lines, cause = nh.check({0: "fine", 1: "slowpoke"}, seen, nh.Threshold(), strict=True, platform="local")
    assert cause is not None and cause.node_index == 1 and "named slow in 2" in cause.summary
    assert nh.blamed({0: "fine", 1: "slowpoke", 2: "fine"}, seen, nh.Threshold()) == [1]  # a spare, with spares
