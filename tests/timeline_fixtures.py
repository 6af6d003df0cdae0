"""Supervisor inputs for the timeline and incident tests: the real supervisor parts (no worker), two
H200s as the shipped h200x2 scenario names them, messages built here."""

from __future__ import annotations

import time
from pathlib import Path

from exporter.app import build_supervisor
from exporter.common import collectors
from exporter.common.collectors import ecc, identity, remapped_rows
from exporter.common.collectors.base import SystemInfo
from exporter.common.nativelib import NativeLibrary
from exporter.common.snapshot import GpuSample, Hello, Snapshot
from exporter.config import Config
from exporter.supervisor.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent
U0, U1 = "GPU-ef65bf38-0ae6-479b-9ebc-46c6463961e6", "GPU-094221fd-19f9-1561-7ef8-949bb0d57826"
BUS = {0: "00000000:00:06.0", 1: "00000000:00:07.0"}
SYSTEM = SystemInfo("580.159.04", "13.580.159.04", "13.0", "13.615.71")


def build(tmp_path: Path, **env: str) -> Supervisor:
    config = Config.from_env({"NVGPU_STATE_FILE": str(tmp_path / "state.json"), **env})
    return build_supervisor(config)


def gpu(i: int, state: str = "up", ecc_uncorrected: int = 0, pending: bool = False) -> GpuSample:
    uuid = (U0, U1)[i]
    readings = [
        identity.Reading("NVIDIA H200", BUS[i], f"16545240123{i}", 9, "96.00.A5.00.1A", "G520.0282.02.02"),
        ecc.Reading(True, True, {"corrected": 0, "uncorrected": ecc_uncorrected}, {}),
        remapped_rows.Reading(0, 0, pending, False, 0),
    ]
    return GpuSample(
        i,
        uuid,
        state,
        {collectors.feature_of(type(r)): r for r in readings} if state == "up" else {},
        time.time(),
        "" if state == "up" else "GPU_IS_LOST",
        bus_id=BUS[i],
        error="" if state == "up" else "GPU_IS_LOST",
    )


def snapshot(*gpus: GpuSample) -> Snapshot:
    return Snapshot(time.time(), 0.01, SYSTEM, tuple(gpus), {}, {}, {}, 0, {})


def hello(system: SystemInfo = SYSTEM, module: str = "580.159.04", native: NativeLibrary | None = None) -> Hello:
    return Hello(1234, system, ((0, U0, BUS[0]), (1, U1, BUS[1])), {}, module, native)
