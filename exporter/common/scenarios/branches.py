"""Driver branch presets for the fake NVML: what a driver of each branch lacks.

A scenario names its branch (``"driver_branch": "R535"``) and the fake answers as a driver of that
branch does: the functions the branch's library lacks answer FUNCTION_NOT_FOUND, a fabric info struct
newer than the branch knows answers ARGUMENT_VERSION_MISMATCH, and a field id the branch's header
does not define answers INVALID_ARGUMENT in its field-value entry (docs/scenarios.md, "Driver
branches"). From the ``nvml.h`` of each branch's CUDA version (NVIDIA/go-nvml ``pkg/nvml/nvml.h``:
12.2 for R535, 12.4 for R550, 12.8 for R570, 13.0 for R580, 13.1 for R590), as collected in
docs/capabilities.md ("Functions missing per branch"). ``missing_functions`` adds to the preset (a
binding without a wrapper, such as nvidia-ml-py 12.535.161 without the ``_v2`` process lists).

Standard library only: the scenario check (``Config``) and the fake both read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Branch:
    """What a driver branch's NVML offers.

    Attributes:
        name: ``R535`` …
        missing: pynvml function names the branch's library lacks (FUNCTION_NOT_FOUND).
        fabric_struct_max: the newest ``nvmlGpuFabricInfo`` struct version
            ``nvmlDeviceGetGpuFabricInfoV`` accepts (newer: ARGUMENT_VERSION_MISMATCH).
        field_id_end: ``NVML_FI_MAX`` of the branch's header: field ids at or above it are unknown.
        unknown_fields: field ids below ``field_id_end`` the header does not define yet.
        cuda_driver_version: ``nvmlSystemGetCudaDriverVersion`` of the branch.
        nvml_major: the NVML API major version (``nvmlSystemGetNVMLVersion`` starts with it).
    """

    name: str
    missing: frozenset[str]
    fabric_struct_max: int
    field_id_end: int
    unknown_fields: frozenset[int] = frozenset()
    cuda_driver_version: int = 0
    nvml_major: int = 12


_BEFORE_R580 = frozenset({"nvmlDeviceGetGpuInstanceProfileInfoById", "nvmlDeviceGetNvLinkInfo"})
_BEFORE_R570 = _BEFORE_R580 | {
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetMarginTemperature",
    "nvmlSystemGetDriverBranch",
}

BRANCHES: dict[str, Branch] = {
    b.name: b
    for b in (
        Branch(
            "R535",
            _BEFORE_R570
            | {
                "nvmlDeviceGetGpuFabricInfoV",  # first in the 12.4 header
                "nvmlDeviceGetProcessesUtilizationInfo",
                "nvmlDeviceGetC2cModeInfoV",
                "nvmlSystemGetConfComputeSettings",
            },
            fabric_struct_max=0,
            field_id_end=197,
            cuda_driver_version=12020,
        ),
        Branch("R550", _BEFORE_R570, fabric_struct_max=2, field_id_end=200, cuda_driver_version=12040),
        Branch(
            "R570",
            _BEFORE_R580 | {"nvmlDeviceGetRepairStatus"},
            fabric_struct_max=2,
            field_id_end=269,
            unknown_fields=frozenset(range(231, 235)),  # the C2C error fields arrive with R575 (12.9)
            cuda_driver_version=12080,
        ),
        Branch("R580", frozenset(), fabric_struct_max=3, field_id_end=274, cuda_driver_version=13000, nvml_major=13),
        Branch("R590", frozenset(), fabric_struct_max=3, field_id_end=289, cuda_driver_version=13010, nvml_major=13),
    )
}


def field_known(branch: Branch | None, field_id: int) -> bool:
    """Whether the branch's header defines ``field_id`` (every id is known without a branch)."""
    return branch is None or (field_id < branch.field_id_end and field_id not in branch.unknown_fields)


def missing(branch: Branch | None) -> frozenset[str]:
    """The pynvml function names the branch's library lacks (none without a branch)."""
    return frozenset() if branch is None else branch.missing
