"""devices.py: visible CUDA devices from the driver's files, as CUDA counts them."""

from __future__ import annotations

import os

import metaflow  # noqa: F401  (must come before our modules)
import pytest

from metaflow_extensions.torchrun.plugins.torchrun.host.devices import cuda_devices, gpu_uuids, visible_count
from metaflow_extensions.torchrun.plugins.torchrun.errors import TorchrunInvalidArgument
from metaflow_extensions.torchrun.plugins.torchrun.launch.resources import (
    NONE,
    Accelerators,
    check_visible_devices,
)

UUIDS = [
    "GPU-1a2b3c4d-0000-0000-0000-000000000000",
    "GPU-1a2b9999-0000-0000-0000-000000000000",
    "GPU-77777777-0000-0000-0000-000000000000",
    "GPU-88888888-0000-0000-0000-000000000000",
]


def driver_tree(tmp_path, uuids):
    root = tmp_path / "gpus"
    root.mkdir()
    for i, uuid in enumerate(uuids):
        d = root / ("0000:%02x:00.0" % (0x10 + i))
        d.mkdir()
        lines = ["Model: \t\t NVIDIA H100 80GB HBM3", "IRQ:   \t\t 42"]
        if uuid:
            lines.append("GPU UUID: \t\t %s" % uuid)
        (d / "information").write_text("\n".join(lines + ["Bus Location: \t 0000:%02x:00.0" % i]) + "\n")
    return str(root)


class TestVisibleCount:
    @pytest.mark.parametrize(
        "spec, expected",
        [
            (None, 4),
            ("", 0),
            ("0", 1),
            ("0,1,2,3", 4),
            ("3,1", 2),
            (" 2 , 0 ", 2),
            ("0,9,1", 1),  # the list ends at the first index out of range
            ("0,-1,1", 1),  # -1 ends it too
            ("-1", 0),
            ("0,,1", 1),
            ("abc", 0),
            ("GPU-7777", 1),  # a unique UUID prefix
            ("GPU-77777777-0000-0000-0000-000000000000,GPU-8888", 2),
            ("GPU-1a2b", 0),  # ambiguous: two GPUs start so
            ("GPU-ffff", 0),
            ("1,GPU-7777", 2),
        ],
    )
    def test_as_cuda_reads_it(self, spec, expected):
        assert visible_count(spec, UUIDS) == expected

    @pytest.mark.parametrize(
        "spec", ["MIG-0e1b6e95-aaaa-bbbb-cccc-000000000000", "0,MIG-x", "0,0", "1,GPU-1a2b9999", "1,1,2"]
    )
    def test_mig_ids_and_repeats_cannot_be_decided(self, spec):
        assert visible_count(spec, UUIDS) is None

    def test_an_unreadable_uuid_makes_a_uuid_spec_undecided(self):
        assert visible_count("GPU-ffff", [UUIDS[0], ""]) is None
        assert visible_count("1", [UUIDS[0], ""]) == 1  # indices still count


class TestDriverFiles:
    def test_uuids_in_bus_order(self, tmp_path):
        root = driver_tree(tmp_path, UUIDS[:2])
        assert gpu_uuids(root) == UUIDS[:2]

    def test_a_file_without_a_uuid(self, tmp_path):
        assert gpu_uuids(driver_tree(tmp_path, ["", UUIDS[1]])) == ["", UUIDS[1]]

    def test_no_driver(self, tmp_path):
        assert gpu_uuids(str(tmp_path / "absent")) is None
        assert cuda_devices({}, str(tmp_path / "absent")) == 0

    @pytest.mark.parametrize(
        "env, expected",
        [({}, 2), ({"CUDA_VISIBLE_DEVICES": ""}, 0), ({"CUDA_VISIBLE_DEVICES": "1"}, 1),
         ({"CUDA_VISIBLE_DEVICES": "MIG-1"}, None)],
    )
    def test_cuda_devices(self, tmp_path, env, expected):
        assert cuda_devices(env, driver_tree(tmp_path, UUIDS[:2])) == expected

    def test_this_machine_has_no_driver_or_agrees_with_its_files(self):
        expected = 0 if not os.path.isdir("/proc/driver/nvidia/gpus") else len(os.listdir("/proc/driver/nvidia/gpus"))
        assert cuda_devices({}) == expected


GPU2 = Accelerators("gpu", 2, "@resources(gpu=2)")


class TestCheck:
    def test_a_cpu_job_on_a_gpu_machine_is_not_refused(self):
        # The step asked for no GPU: gloo on CPU, whatever the machine has.
        assert check_visible_devices(2, NONE, cuda_available=True, cuda_count=1) is None
        assert check_visible_devices(64, NONE, cuda_available=True, cuda_count=8) is None

    def test_an_over_ask_names_both_numbers_and_the_request(self):
        with pytest.raises(TorchrunInvalidArgument) as info:
            check_visible_devices(2, GPU2, cuda_available=True, cuda_count=1)
        text = str(info.value)
        assert "nproc_per_node=2" in text and "only 1 visible CUDA device" in text
        assert "@resources(gpu=2)" in text
