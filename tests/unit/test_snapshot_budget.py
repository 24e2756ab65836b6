"""The node's snapshot budget is the container's, not the host's: the smallest of /proc/meminfo's
MemAvailable and the headroom of every memory cgroup limit above this process (v2 and v1), read from a
fake tree here (``budget.room`` reads under a root it is given)."""

import os

from metaflow_extensions.torchrun.plugins.torchrun.snapshots.node import budget

GB = 1 << 30


def tree(root, meminfo_kb=None, cgroup=None, files=None):
    """A fake ``/``: /proc/meminfo, /proc/self/cgroup, and files under /sys/fs/cgroup."""
    os.makedirs(os.path.join(root, "proc/self"), exist_ok=True)
    if meminfo_kb is not None:
        with open(os.path.join(root, "proc/meminfo"), "w") as f:
            f.write("MemTotal: %d kB\nMemFree: 1 kB\nMemAvailable: %d kB\n" % (meminfo_kb * 2, meminfo_kb))
    if cgroup is not None:
        with open(os.path.join(root, "proc/self/cgroup"), "w") as f:
            f.write(cgroup)
    for path, text in (files or {}).items():
        full = os.path.join(root, "sys/fs/cgroup", path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    return str(root)


HOST_64G = 64 * GB // 1024  # kB


def test_cgroup_v2_a_pod_limit_below_the_hosts_available_memory_is_the_room(tmp_path):
    root = tree(tmp_path, HOST_64G, "0::/kubepods/burstable/pod1/c1\n", {
        "kubepods/burstable/pod1/c1/memory.max": "max\n",  # the container's own: none
        "kubepods/burstable/pod1/c1/memory.current": "100\n",
        "kubepods/burstable/pod1/memory.max": "%d\n" % (8 * GB),  # the pod's limit, a parent's
        "kubepods/burstable/pod1/memory.current": "%d\n" % (3 * GB),
        "kubepods/burstable/pod1/memory.stat": "anon 1\ninactive_file %d\nactive_file 5\n" % GB,
    })
    found = budget.room(root)
    assert found.bytes == 8 * GB - 2 * GB  # the working set: usage less its inactive page cache
    assert "container's memory limit (cgroup v2: 2.00 GB of 8.00 GB in use)" in found.source
    share = budget.share_of(0.25, root)
    assert share.bytes == (6 * GB) // 4 and share.source.startswith("25% of the room under the container's")


def test_cgroup_v1_limit_and_usage(tmp_path):
    root = tree(tmp_path, HOST_64G, "12:pids:/x\n4:memory:/docker/abc\n0::/\n", {
        "memory/docker/abc/memory.limit_in_bytes": "%d\n" % (4 * GB),
        "memory/docker/abc/memory.usage_in_bytes": "%d\n" % GB,
        "memory/docker/abc/memory.stat": "cache 5\ntotal_inactive_file 0\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n",  # the root's: no limit
    })
    found = budget.room(root)
    assert found.bytes == 3 * GB and "cgroup v1" in found.source


def test_cgroup_v1_seen_from_inside_a_container_without_its_path(tmp_path):
    """Docker on v1 mounts the container's own cgroup at the mount's root; /proc/self/cgroup names the host's path."""
    root = tree(tmp_path, HOST_64G, "4:memory:/docker/abc\n", {
        "memory/memory.limit_in_bytes": "%d\n" % (2 * GB),
        "memory/memory.usage_in_bytes": "%d\n" % (GB // 2),
    })
    assert budget.room(root).bytes == 2 * GB - GB // 2


def test_no_limit_leaves_the_hosts_available_memory(tmp_path):
    root = tree(tmp_path, 16 * GB // 1024, "0::/user.slice\n", {
        "user.slice/memory.max": "max\n", "user.slice/memory.current": "%d\n" % GB})
    found = budget.room(root)
    assert found.bytes == 16 * GB and found.source == "the host's available memory (/proc/meminfo)"


def test_a_host_with_less_available_than_the_containers_headroom_wins(tmp_path):
    root = tree(tmp_path, 2 * GB // 1024, "0::/c\n", {"c/memory.max": "%d\n" % (8 * GB), "c/memory.current": "0\n"})
    assert budget.room(root).bytes == 2 * GB and "/proc/meminfo" in budget.room(root).source


def test_nothing_readable_is_an_assumed_figure_said_so(tmp_path):
    found = budget.room(tree(tmp_path))
    assert found.bytes == budget.FALLBACK and "assumed" in found.source
    assert budget.share_of(0.25, str(tmp_path)).bytes == 1 << 30


def test_this_machine_has_a_room():
    assert budget.room().bytes > 0
