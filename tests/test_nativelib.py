"""The native library check: which libnvidia-ml.so the worker mapped, whose it is, and which side moved."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from exporter.common import nativelib
from exporter.common.snapshot import Hello, InitFailed
from exporter.common.snapshotdecode import decode_message
from exporter.worker import main as worker_main
from exporter.worker.nvml.backend import FakeBackend
from tests.exporter_proc import load_scenario, write_scenario

LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"
SITE_LIB = "/usr/local/lib/python3.12/site-packages/nvidia/nvml/lib/libnvidia-ml.so.575.51.03"
ROOT = "1 0 0:50 / / rw,relatime - overlay overlay rw,lowerdir=/l\n"
BIND = f"2 1 259:1 {LIB} {LIB} ro,nosuid,nodev,relatime - ext4 /dev/nvme0n1p1 rw\n"


def maps(path: str, deleted: bool = False) -> str:
    return (
        "7f0000000000-7f0000100000 r--p 00000000 fd:00 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        f"7f1000000000-7f1000200000 r-xp 00000000 fd:00 2   {path}{' (deleted)' if deleted else ''}\n"
    )


def test_the_mapped_library_and_its_deleted_mark_are_read_from_maps() -> None:
    assert nativelib.mapped_library(maps(LIB)) == (LIB, False)
    assert nativelib.mapped_library(maps(LIB, deleted=True)) == (LIB, True)
    assert nativelib.mapped_library(maps("/usr/lib/libcuda.so.1")) == ("", False)
    assert nativelib.mapped_library("garbage\n\n1 2 3\n") == ("", False)


def test_a_bind_mounted_file_is_the_hosts_and_a_file_on_the_overlay_root_is_the_images() -> None:
    assert nativelib.origin_of(LIB, ROOT + BIND)[0] == "host"
    assert nativelib.origin_of(LIB, ROOT)[0] == "image"
    assert nativelib.origin_of(SITE_LIB, ROOT + BIND)[0] == "image"  # a wheel's copy, whatever is mounted
    assert nativelib.origin_of(LIB, "")[0] == "unknown"
    assert nativelib.origin_of("", ROOT)[0] == "none"
    gke = "3 1 259:1 /home/kubernetes/bin/nvidia /usr/local/nvidia ro - ext4 /dev/sda1 rw\n"
    origin, evidence = nativelib.origin_of("/usr/local/nvidia/lib64/libnvidia-ml.so.580.95.05", ROOT + gke)
    assert origin == "host" and "/usr/local/nvidia" in evidence
    assert nativelib.origin_of(LIB, "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")[0] == "host"  # bare metal


def test_versions_that_agree_on_the_hosts_library_are_ok() -> None:
    lib = nativelib.inspect(nativelib.ProcView(maps(LIB), ROOT + BIND), "580.95.05", "13.580.95.05")
    assert (lib.state, lib.origin, lib.library_version, lib.problem) == ("ok", "host", "580.95.05", False)
    assert lib.domain == "" and not lib.refused_by_strict


def test_the_hosts_library_ahead_of_the_kernel_module_is_a_driver_upgraded_under_the_node() -> None:
    lib = nativelib.inspect(nativelib.ProcView(maps(LIB), ROOT + BIND), "580.82.07", "13.580.95.05")
    assert lib.state == "driver_upgraded" and lib.domain == "driver"
    assert "580.82.07" in lib.message and "reboot" in lib.message and "exporter does not help" in lib.message


def test_a_library_replaced_on_disk_under_the_running_worker_is_a_driver_upgrade_too() -> None:
    newer = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.105.08"
    view = nativelib.ProcView(maps(LIB, deleted=True), ROOT + BIND, (newer,))
    lib = nativelib.inspect(view, "580.95.05", "13.580.95.05")
    assert lib.deleted and lib.state == "driver_upgraded" and newer in lib.message


def test_the_images_own_library_is_the_exporters_fault_and_strict_refuses_it_when_the_hosts_is_visible() -> None:
    view = nativelib.ProcView(maps(SITE_LIB), ROOT, (LIB,))
    lib = nativelib.inspect(view, "580.95.05", "12.575.51.03")
    assert lib.state == "image_library" and lib.domain == "exporter" and lib.refused_by_strict
    assert SITE_LIB in lib.message and LIB in lib.message and "fix the image" in lib.message
    alone = nativelib.inspect(nativelib.ProcView(maps(SITE_LIB), ROOT), "580.95.05", "12.575.51.03")
    assert alone.state == "image_library" and not alone.refused_by_strict  # versions differ, no host copy seen


def test_no_library_with_a_loaded_module_is_a_missing_mount() -> None:
    lib = nativelib.inspect(nativelib.ProcView("", ROOT), "580.95.05", "", init_error="LIBRARY_NOT_FOUND")
    assert lib.state == "library_missing" and lib.domain == "exporter" and "libnvidia-ml.so.580.95.05" in lib.message
    assert nativelib.inspect(nativelib.ProcView("", ""), "", "", init_error="LIBRARY_NOT_FOUND").state == "unknown"


def test_the_nvml_version_stands_in_for_a_file_name_without_one() -> None:
    lib = nativelib.inspect(
        nativelib.ProcView(maps("/usr/lib64/libnvidia-ml.so.1"), ROOT + BIND), "580.95.05", "13.580.95.05"
    )
    assert lib.file_version == "" and lib.library_version == "580.95.05"


def test_the_result_travels_in_hello_init_failed_and_native_messages() -> None:
    lib = nativelib.inspect(nativelib.ProcView(maps(LIB), ROOT + BIND, (LIB,)), "580.95.05", "13.580.95.05")
    wire = json.loads(json.dumps(dataclasses.asdict(lib)))
    assert decode_message({"type": "native", **wire}) == lib
    failed = decode_message(
        {"type": "init_failed", "code": 18, "error": "LIB_RM_VERSION_MISMATCH", "message": "m", "native": wire}
    )
    assert isinstance(failed, InitFailed) and failed.native == lib
    hello = decode_message({"type": "hello", "pid": 1, "system": {}, "gpus": [], "feature_states": {}, "native": wire})
    assert isinstance(hello, Hello) and hello.native == lib


@pytest.mark.parametrize(
    ("native", "state", "origin"),
    [
        (None, "ok", "host"),
        ({"origin": "image", "path": SITE_LIB, "host_libraries": [LIB]}, "image_library", "image"),
        ({"origin": "none"}, "unknown", "none"),
    ],
)
def test_the_fake_presents_its_scenarios_library_through_the_backend(
    tmp_path: Path, native: dict[str, object] | None, state: str, origin: str
) -> None:
    scenario = load_scenario("h200x1")
    if native is not None:
        scenario["native_library"] = native
    backend = FakeBackend(str(write_scenario(tmp_path, scenario)))
    lib = worker_main.native_check(backend, "580.159.04", "13.580.159.04")
    assert (lib.state, lib.origin) == (state, origin)


def test_the_real_backend_reads_this_process(tmp_path: Path) -> None:
    """read_proc_view reads whatever files it is pointed at; unreadable ones read as empty."""
    (tmp_path / "maps").write_text(maps(LIB))
    view = nativelib.read_proc_view(str(tmp_path / "maps"), str(tmp_path / "none"), [str(tmp_path / "*.so.*")])
    assert nativelib.mapped_library(view.maps) == (LIB, False) and view.mountinfo == "" and view.host_libraries == ()
    assert os.path.exists("/proc/self/maps") and "python" in nativelib.read_proc_view().maps.lower()


def test_a_fifo_or_an_oversized_table_reads_as_empty_without_waiting(tmp_path: Path) -> None:
    """A FIFO where a /proc table should be (no writer) is refused at once, and a table larger than
    the bound reads as empty rather than cut short (a cut mount table would name the wrong mount)."""
    os.mkfifo(tmp_path / "maps")
    (tmp_path / "mountinfo").write_bytes(b"x" * (nativelib.PROC_VIEW_MAX_BYTES + 1))
    view = nativelib.read_proc_view(str(tmp_path / "maps"), str(tmp_path / "mountinfo"), [])
    assert (view.maps, view.mountinfo) == ("", "")
