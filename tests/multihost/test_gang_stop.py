"""A stop is the gang's, across hosts: one node told, every rank saved.

Two hosts (network namespaces), two processes each, started as a JobSet starts
its pods. Every rank's SIGTERM handler pauses, then enters an all_reduce with
every other rank, then writes its file (tests/flows/scripts/collective_save.py):
the four files exist only if both nodes' ranks were told and given the grace.

The spot test runs Metaflow's own spot termination monitor (the sidecar that
``@kubernetes`` starts in the task, ``spot_monitor_sidecar.py``), unchanged, on
node 1's host: a fake instance metadata service answers it at 169.254.169.254
inside that host's network namespace (fake_imds.py), "spot" and then a
termination time. The monitor writes the time to /tmp/spot_termination_notice
(each host gets its own /tmp here, as each pod has its own) and SIGTERMs its own
parent, which is the sidecar worker process, not the task: the file is the only
warning the task gets, and the gang stops because @torchrun watches it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .harness import FLOWS, HOST_ZYGOTE_ENV, REPO, PlatformRun

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(240)]

GANG = os.path.join(FLOWS, "gang_flow.py")
COLLECTIVE_SAVE = ["--script", "collective_save.py", "--nproc", "2"]
HERE = os.path.dirname(os.path.abspath(__file__))
NOTICE = "/tmp/spot_termination_notice"  # where Metaflow's monitor writes (spot_monitor_sidecar.py)
# Each host gets its own /tmp, as each pod has its own: a tmpfs, with every
# directory the task needs from the old /tmp bound back into it (the sandbox,
# holding the flow's datastore; the checkout and its venv when they lie under
# /tmp, as in a CI clone there). Each is opened first (fd 3 on), since the old
# /tmp is hidden once the tmpfs covers it; dash opens fds up to 9.
_PRIVATE_TMP = (
    'back="$(pwd)"; keeps="$1"; shift; set -f; IFS=:; i=3; '
    'for d in $keeps; do eval "exec $i<\\"\\$d\\"" || exit 97; i=$((i+1)); done; '
    'mount -t tmpfs tmpfs /tmp || exit 98; i=3; '
    'for d in $keeps; do mkdir -p "$d" && mount --no-canonicalize --bind "/proc/$$/fd/$i" "$d" || exit 99; '
    'eval "exec $i<&-"; i=$((i+1)); done; '
    'unset IFS; set +f; cd "$back" && exec "$@"'
)


def _kept_from_tmp(*paths):
    """The top directories under /tmp that ``paths`` need: one bind each."""
    kept = []
    for path in paths:
        parts = os.path.realpath(path).split(os.sep)
        if len(parts) > 2 and parts[1] == "tmp":
            top = os.sep.join(parts[:3])
            if top not in kept:
                kept.append(top)
    assert len(kept) <= 7, kept  # fds 3 to 9
    return kept


def _attrs(**kw):
    return {"MFTR_TORCHRUN_ATTRS": json.dumps(kw)}


def _task_pid(run, index):
    pid = run.procs[index].pid  # ip netns exec, unshare and sh all exec: the task itself
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        assert b"platform_task.py" in f.read()
    return pid


def _wait_ready(sandbox, run):
    try:
        sandbox.wait_for_reports("ready-", 4, timeout=150, procs=list(run.procs.values()))
    except AssertionError as e:
        raise AssertionError("%s\n%s" % (e, run.logs_summary())) from None


def _check_saved(sandbox, run, codes, node):
    assert codes[0] != 0 and codes[1] != 0, run.logs_summary()
    saved = sandbox.reports("ckpt-")
    assert sorted(saved) == [0, 1, 2, 3], run.logs_summary()
    assert all(c["sum"] == 4.0 for c in saved.values()), saved
    told = sandbox.reports("told-")
    skew = max(t["at"] for t in told.values()) - min(t["at"] for t in told.values())
    print("stop skew across 2 hosts (first to last rank's SIGTERM): %.3f s" % skew)
    return saved, told


def test_one_hosts_sigterm_saves_every_ranks_collective_checkpoint(network, sandbox):
    run = PlatformRun(sandbox, network(2), "kubernetes", GANG, params=COLLECTIVE_SAVE,
                      env=dict(_attrs(shutdown_grace=20), MFTR_SAVE_SECONDS="8"))
    run.prepare()
    run.launch_all()
    _wait_ready(sandbox, run)
    os.kill(_task_pid(run, 1), signal.SIGTERM)
    codes = run.wait(timeout=90)
    _check_saved(sandbox, run, codes, 1)
    assert "node 1 was told to stop (SIGTERM" in run.node_log(1), run.logs_summary()
    assert "node 0 stopped: node 1 was told to stop (SIGTERM" in run.node_log(0), run.logs_summary()


class SpotRun(PlatformRun):
    """Pods on spot instances: ``@kubernetes`` starts Metaflow's spot monitor
    (METAFLOW_KUBERNETES_WORKLOAD and the pod's variables, as the JobSet's pod
    spec sets them; MF_PATHSPEC and MF_ATTEMPT, as the pod's command exports them
    for mflog), and each host has its own /tmp."""

    def node_argv(self, index):
        keep = _kept_from_tmp(self.sandbox.tmp, REPO, sys.prefix, sys.executable, os.path.realpath(sys.executable))
        return ["sh", "-c", _PRIVATE_TMP, "sh", ":".join(keep)] + super().node_argv(index)

    def launch(self, index):
        self.env.pop(HOST_ZYGOTE_ENV, None)  # the worker's warm process is under the /tmp each host hides
        node = self.nodes[index]
        node.env.update({
            "METAFLOW_KUBERNETES_WORKLOAD": "1",
            "METAFLOW_KUBERNETES_POD_NAME": node.hostname,
            "METAFLOW_KUBERNETES_POD_NAMESPACE": "default",
            "METAFLOW_KUBERNETES_POD_ID": "pod-%d" % index,
            "METAFLOW_KUBERNETES_SERVICE_ACCOUNT_NAME": "default",
            "METAFLOW_KUBERNETES_NODE_IP": self.hosts[index].ip,
            "MF_PATHSPEC": "GangFlow/%s/train/%s" % (self.run_id, node.task_id),
            "MF_ATTEMPT": "0",
        })
        return super().launch(index)


def _fake_imds(sandbox, host):
    """The instance metadata service on ``host``: its process, and the file
    that makes it announce a termination."""
    subprocess.run(["ip", "-n", host.netns, "addr", "add", "169.254.169.254/32", "dev", "lo"], check=True)
    trigger = os.path.join(sandbox.tmp, "termination-time")
    ready = os.path.join(sandbox.tmp, "imds-ready")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, sys.executable, os.path.join(HERE, "fake_imds.py"), trigger, ready],
        env=sandbox.env, stdout=open(sandbox.log_path("imds"), "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)

    def stop():
        proc.kill()
        proc.wait()

    sandbox.cleanups.append(stop)
    deadline = time.monotonic() + 20
    while not os.path.exists(ready):
        assert proc.poll() is None and time.monotonic() < deadline, sandbox.read_log("imds")
        time.sleep(0.05)
    return trigger


def _iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _spot_monitors(sandbox):
    """Metaflow's spot monitor processes of this test: ``{pid: parent pid}``.
    The sidecar worker runs the monitor's loop in a forked child with the same
    command line (multiprocessing.Process), started only on a spot instance."""
    from .harness import processes_with_token

    found = {}
    for pid in processes_with_token(sandbox.token):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
            with open("/proc/%d/stat" % pid, "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            continue
        if any(a.endswith(b"sidecar_worker.py") for a in cmd) and b"spot_termination_monitor" in cmd:
            found[pid] = ppid
    return found


def test_a_spot_notice_from_metaflows_own_monitor_stops_the_gang_gracefully(network, sandbox):
    net = network(2)
    trigger = _fake_imds(sandbox, net.hosts[1])
    run = SpotRun(sandbox, net, "kubernetes", GANG, params=COLLECTIVE_SAVE,
                  env=dict(_attrs(shutdown_grace=120), MFTR_SAVE_SECONDS="5"))
    run.prepare()
    run.launch_all()
    _wait_ready(sandbox, run)
    monitors = _spot_monitors(sandbox)
    workers = [p for p, parent in monitors.items() if parent not in monitors]
    loops = {p: parent for p, parent in monitors.items() if parent in monitors}
    # One sidecar worker per pod; the polling loop only where the metadata says "spot".
    assert len(workers) == 2 and len(loops) == 1, monitors
    # The two-minute warning, given with 60 s left: the grace is capped by it.
    termination = _iso(time.time() + 60)
    with open(trigger + ".tmp", "w") as f:
        f.write(termination)
    os.replace(trigger + ".tmp", trigger)
    noticed = time.time()
    sandbox.wait_for_reports("told-", 4, timeout=30, procs=list(run.procs.values()))
    # The monitor's SIGTERM went to its parent (os.getppid()): the sidecar
    # worker is gone while the task it serves goes on saving.
    # The ranks can be told before that worker has finished exiting: wait for it.
    spot_worker = list(loops.values())[0]
    deadline = time.monotonic() + 20
    while spot_worker in _spot_monitors(sandbox) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert spot_worker not in _spot_monitors(sandbox) and run.procs[1].poll() is None
    codes = run.wait(timeout=120)
    _saved, told = _check_saved(sandbox, run, codes, 1)
    log1 = run.node_log(1)
    assert "node 1 got a spot termination notice (the instance terminates at %s)" % termination in log1, \
        run.logs_summary()
    assert "capped by the time left before the termination" in log1
    assert "node 0 stopped: node 1 got a spot termination notice" in run.node_log(0), run.logs_summary()
    # Told by the file, not by a signal: the task was never signalled, or its
    # cause would say SIGTERM.
    assert "was told to stop (SIGTERM" not in log1
    # Within one of the monitor's 5 s polls (and ours, 0.5 s) of the notice.
    first = min(t["at"] for t in told.values())
    print("spot notice: ranks told %.1f s after the termination time appeared at the metadata service"
          % (first - noticed))
    assert first - noticed <= 5 + 0.5 + 5, first - noticed
