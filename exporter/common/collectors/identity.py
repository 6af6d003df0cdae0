"""GPU identity: ``nvgpu_gpu_info`` (name, PCI bus id, serial, architecture, versions).

Sources: nvmlDeviceGetName, nvmlDeviceGetPciInfo (``busId``), nvmlDeviceGetSerial (boards with an
inforom only), nvmlDeviceGetArchitecture; the VBIOS and InfoROM image versions
(nvmlDeviceGetVbiosVersion, nvmlDeviceGetInforomImageVersion: ``nvidia-smi -q``'s "VBIOS Version"
and "Inforom Version / Image Version") go into the incident record's versions, not into a label.
Read once, and again only at a re-probe: these do not
change without a driver reload, which restarts the worker anyway. System versions come with the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.metric import GpuKey, MetricDef
from exporter.common.plausibility import Check, Exempt

if TYPE_CHECKING:
    from exporter.common.collectors.base import SystemInfo
    from exporter.common.metric import Family as Metric
    from exporter.worker.nvml.client import DeviceClient

FEATURE = "identity"
NEEDS: tuple[str, ...] = ()

GPU_INFO = MetricDef(
    "nvgpu_gpu_info",
    "GPU identity (nvmlDeviceGetName, nvmlDeviceGetPciInfo, nvmlDeviceGetSerial, "
    "nvmlDeviceGetArchitecture, nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, "
    "nvmlSystemGetCudaDriverVersion); value is always 1",
    ("name", "pci_bus_id", "serial", "architecture", "driver_version", "nvml_version", "cuda_driver_version"),
)
METRICS = (GPU_INFO,)

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    11: "orin",
    13: "rubin",
}


def _text(value: Any) -> str:
    """Driver strings as text: bytes decoded, odd bytes replaced, NULs and newlines dropped."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return "".join(ch for ch in str(value) if ch.isprintable()).strip()


@dataclass(frozen=True)
class Reading:
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    architecture: int | None
    vbios_version: str | None = None
    inforom_version: str | None = None


CHECKS: tuple[Check, ...] = (
    Exempt(
        "name",
        "pci_bus_id",
        "serial",
        "vbios_version",
        "inforom_version",
        why="driver strings, made printable where they are read",
    ),
    Exempt("architecture", why="an enum (NVML_DEVICE_ARCH_*); families() shows a value it does not know as its number"),
)


@dataclass
class Static(GpuState):
    """The identity as first read, until the next re-probe."""

    LIFETIME = Lifetime.PROBE
    reading: Reading | None = None


def read(dev: DeviceClient) -> Reading | None:
    static = dev.state_of(Static)
    if static.reading is not None:
        return static.reading
    name = dev.get(FEATURE, "nvmlDeviceGetName")
    pci = dev.get(FEATURE, "nvmlDeviceGetPciInfo")
    serial = dev.get(FEATURE, "nvmlDeviceGetSerial")
    arch = dev.get(FEATURE, "nvmlDeviceGetArchitecture")
    vbios = dev.get(FEATURE, "nvmlDeviceGetVbiosVersion")
    inforom = dev.get(FEATURE, "nvmlDeviceGetInforomImageVersion")
    bus = getattr(pci, "busId", None) if pci is not None else None
    reading = Reading(
        name=_text(name) if name is not None else None,
        pci_bus_id=_text(bus) if bus is not None else None,
        serial=_text(serial) if serial is not None else None,
        architecture=int(arch) if arch is not None else None,
        vbios_version=_text(vbios) if vbios is not None else None,
        inforom_version=_text(inforom) if inforom is not None else None,
    )
    static.reading = reading
    return reading


def families(samples: Sequence[tuple[GpuKey, Reading]], system: SystemInfo) -> Iterable[Metric]:
    info = GPU_INFO.family()
    for key, r in samples:
        arch = ARCHITECTURES.get(r.architecture, str(r.architecture)) if r.architecture is not None else ""
        info.add(
            key,
            1,
            r.name or "",
            r.pci_bus_id or "",
            r.serial or "",
            arch,
            system.driver_version,
            system.nvml_version,
            system.cuda_driver_version,
        )
    yield from info.done()
