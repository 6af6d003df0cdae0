"""FEATURES: every feature the exporter can switch, in the order it reports them, as data.

Each :class:`Feature` is a named group of NVML (or non-NVML) queries with its default, a line for
humans and the NVML functions it calls (nvml.h names, as called through ``pynvml``). Switching and
resolution are in :mod:`guards.features`; which feature owns which metric is in docs/metrics.md.
Standard library only, like every module of ``guards``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["FEATURES", "Feature"]


@dataclass(frozen=True)
class Feature:
    """One named group of NVML (or non-NVML) queries that can be switched on and off.

    Attributes:
        name: Registry key, lower-case snake case (``nvlink_throughput``); also the ``feature``
            label value of the self-metrics.
        default: Whether the feature runs when its mode is ``auto`` and no rule disables it.
        description: One line for humans: what it reads and why it may be switched off.
        nvml_functions: pynvml function names (as called through ``pynvml``) the feature makes;
            the worker names one of these in its breadcrumb before each call. Empty for
            features that do not call NVML (kernel log, kubelet).
    """

    name: str
    default: bool
    description: str
    nvml_functions: tuple[str, ...]


def _registry(*features: Feature) -> Mapping[str, Feature]:
    return MappingProxyType({feature.name: feature for feature in features})


FEATURES: Mapping[str, Feature] = _registry(
    Feature(
        name="identity",
        default=True,
        description=("nvgpu_gpu_info: name, PCI bus id, serial, architecture, driver/NVML/CUDA versions"),
        nvml_functions=(
            "nvmlDeviceGetName",
            "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetSerial",
            "nvmlDeviceGetArchitecture",
            "nvmlDeviceGetVbiosVersion",
            "nvmlDeviceGetInforomImageVersion",
            "nvmlSystemGetDriverVersion",
            "nvmlSystemGetNVMLVersion",
            "nvmlSystemGetCudaDriverVersion",
        ),
    ),
    Feature(
        name="mig",
        default=True,
        description=(
            "MIG mode (current and pending; read once per re-probe on a GPU with MIG off) and, with MIG on, "
            "the GPU instances and MIG devices (ids, profile, MIG UUID) every sample, memory per GPU "
            "instance and compute processes per MIG device; series only on GPUs with MIG on or pending"
        ),
        nvml_functions=(
            "nvmlDeviceGetMigMode",
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceGetMigDeviceHandleByIndex",
            "nvmlDeviceGetGpuInstanceId",
            "nvmlDeviceGetComputeInstanceId",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetGpuInstanceById",
            "nvmlGpuInstanceGetInfo",
            "nvmlDeviceGetGpuInstanceProfileInfoById",
            "nvmlDeviceGetGpuInstanceProfileInfo",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
        ),
    ),
    Feature(
        name="utilization",
        default=True,
        description=(
            "GPU, memory, encoder and decoder utilization ratios; absent on MIG-enabled GPUs (NVML: not "
            "supported with MIG enabled; nvgpu_gpu_feature_unsupported says so per GPU)"
        ),
        nvml_functions=(
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetEncoderUtilization",
            "nvmlDeviceGetDecoderUtilization",
        ),
    ),
    Feature(
        name="memory",
        default=True,
        description="framebuffer used/free/reserved/total (memory info v2 when present) and BAR1",
        nvml_functions=("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetBAR1MemoryInfo"),
    ),
    Feature(
        name="power",
        default=True,
        description=(
            "GPU power usage, enforced power limit, energy counter (since driver load), and module and "
            "memory power where NVML has them (field NVML_FI_DEV_POWER_AVERAGE, 185, by power scope)"
        ),
        nvml_functions=(
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetEnforcedPowerLimit",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetFieldValues",
        ),
    ),
    Feature(
        name="temperature",
        default=True,
        description=(
            "GPU temperature (TemperatureV on 570+, legacy call before) and HBM temperature "
            "(field NVML_FI_DEV_MEMORY_TEMP, 82); the margins to the slowdown and memory-maximum "
            "thresholds (nvmlDeviceGetMarginTemperature on 570+, nvmlDeviceGetTemperatureThreshold), "
            "the thresholds themselves with details"
        ),
        nvml_functions=(
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetTemperatureThreshold",
            "nvmlDeviceGetMarginTemperature",
        ),
    ),
    Feature(
        name="fan",
        default=True,
        description="fan speed per fan; NOT_SUPPORTED on passive data-centre boards",
        nvml_functions=("nvmlDeviceGetNumFans", "nvmlDeviceGetFanSpeed_v2"),
    ),
    Feature(
        name="clocks",
        default=True,
        description="current and max clocks, performance state, clock-event reasons",
        nvml_functions=(
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetMaxClockInfo",
            "nvmlDeviceGetPerformanceState",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ),
    ),
    Feature(
        name="throttle_time",
        default=True,
        description=(
            "cumulative time per clock-event (throttle) reason: fields NVML_FI_DEV_PERF_POLICY_* (74-81) "
            "and, from driver 580.82, NVML_FI_DEV_CLOCKS_EVENT_REASON_* (269-271) in one field-value call; "
            "nvmlDeviceGetViolationStatus for a reason whose field the driver lacks"
        ),
        nvml_functions=(
            "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetViolationStatus",
            "nvmlSystemGetDriverVersion",
        ),
    ),
    Feature(
        name="pcie",
        default=True,
        description="PCIe link generation/width (current and max) and replay counter",
        nvml_functions=(
            "nvmlDeviceGetCurrPcieLinkGeneration",
            "nvmlDeviceGetMaxPcieLinkGeneration",
            "nvmlDeviceGetCurrPcieLinkWidth",
            "nvmlDeviceGetMaxPcieLinkWidth",
            "nvmlDeviceGetPcieReplayCounter",
        ),
    ),
    Feature(
        name="ecc",
        default=True,
        description="ECC mode (current and pending) and corrected/uncorrected error counters (volatile and aggregate)",
        nvml_functions=("nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors"),
    ),
    Feature(
        name="remapped_rows",
        default=True,
        description=(
            "row remapping (correctable/uncorrectable, pending, failure) and the driver's "
            "recommended recovery action (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 230)"
        ),
        nvml_functions=("nvmlDeviceGetRemappedRows", "nvmlDeviceGetFieldValues"),
    ),
    Feature(
        name="nvlink",
        default=True,
        description=(
            "NVLink links up and error counters (replay, recovery, CRC flit/data) per GPU: the DL replay, "
            "recovery and CRC fields (161-163) per link in one field-value call every sample, "
            "nvmlDeviceGetNvLinkErrorCounter where the driver lacks them and for data CRC (every 30 s); "
            "per-link series only for links with replay, recovery or flit-CRC errors (nvlink_links: all); "
            "NVLink5 (Blackwell) error counters NVML_FI_DEV_NVLINK_COUNT_* in a field-value call of their own"
        ),
        nvml_functions=("nvmlDeviceGetNvLinkState", "nvmlDeviceGetFieldValues", "nvmlDeviceGetNvLinkErrorCounter"),
    ),
    Feature(
        name="nvlink_throughput",
        default=True,
        description=(
            "NVLink TX/RX data bytes per GPU via field values NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX "
            "(138/139, scope 0xFFFFFFFF = all links; per link with nvlink_links; NVLink5 byte counters 202/204 "
            "where those are unsupported) and the link count "
            "NVML_FI_DEV_NVLINK_LINK_COUNT (91); the query that crashed with glibc heap corruption on H20 / "
            "driver 580 (docs/design.md)"
        ),
        nvml_functions=("nvmlDeviceGetFieldValues",),
    ),
    Feature(
        name="c2c",
        default=True,
        description=(
            "NVLink-C2C between the GPU and its Grace CPU (GH200, GB200): links present and up, CRC and "
            "replay error counters (fields 170, 171, 231-233); absent on GPUs without C2C"
        ),
        nvml_functions=("nvmlDeviceGetFieldValues",),
    ),
    Feature(
        name="nvlink_links",
        default=False,
        description=(
            "per-link NVLink series: state, error counters and TX/RX bytes of every link (18 links: 6 series "
            "per link), read by the nvlink and nvlink_throughput features; off by default: per-GPU totals "
            "instead, plus the links that have errors"
        ),
        nvml_functions=(),
    ),
    Feature(
        name="details",
        default=False,
        description=(
            "series beyond the default budget of 60 per GPU (docs/performance.md): graphics, video and "
            "memory max clocks, performance state and clock-event flags (clocks); five more throttle "
            "reasons (throttle_time); free and BAR1 memory (memory); lifetime ECC counters (ecc); PCIe "
            "maximum generation and width (pcie); encoder and decoder utilization (utilization); the link "
            "count (nvlink_throughput); read by those features when this one is on"
        ),
        nvml_functions=(),
    ),
    Feature(
        name="fabric",
        default=True,
        description=(
            "NVLink fabric registration state and status, health (mask and summary) and the NVLink domain "
            "(clique id, cluster UUID): nvmlDeviceGetGpuFabricInfoV v3, v2 (550+), else the v1 call (535); "
            "NVSwitch systems whose Fabric Manager has not completed or whose fabric runs degraded; absent "
            "on GPUs without a fabric"
        ),
        nvml_functions=("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"),
    ),
    Feature(
        name="confidential_computing",
        default=True,
        description=(
            "confidential computing: the system's CC mode and whether its GPUs accept work "
            "(nvmlSystemGetConfComputeState, nvmlSystemGetConfComputeGpusReadyState: a state, not an "
            "error) and, with CC on, each GPU's protected memory; unsupported on systems without CC"
        ),
        nvml_functions=(
            "nvmlSystemGetConfComputeState",
            "nvmlSystemGetConfComputeGpusReadyState",
            "nvmlDeviceGetConfComputeProtectedMemoryUsage",
        ),
    ),
    Feature(
        name="gpm",
        default=True,
        description=(
            "profiling through NVML GPM (Hopper+): graphics, SM, SM occupancy, tensor and DRAM bandwidth "
            "activity over the last sample interval, PCIe and NVLink bytes; two GPM samples per GPU held in "
            "the worker; on a MIG-enabled GPU the activity per GPU instance (nvmlGpmMigSampleGet, two samples "
            "per GPU instance, the layout from the mig feature)"
        ),
        nvml_functions=(
            "nvmlGpmQueryDeviceSupport",
            "nvmlDeviceGetMigMode",
            "nvmlGpmSampleAlloc",
            "nvmlGpmSampleGet",
            "nvmlGpmMigSampleGet",
            "nvmlGpmMetricsGet",
            "nvmlGpmSampleFree",
        ),
    ),
    Feature(
        name="gpm_pipes",
        default=False,
        description=(
            "GPM activity per pipe (HMMA, IMMA, DMMA, DFMA tensor pipes; FP64, FP32, FP16): seven more "
            "series per GPU, off by default; its own GPM samples"
        ),
        nvml_functions=(
            "nvmlGpmQueryDeviceSupport",
            "nvmlDeviceGetMigMode",
            "nvmlGpmSampleAlloc",
            "nvmlGpmSampleGet",
            "nvmlGpmMetricsGet",
            "nvmlGpmSampleFree",
        ),
    ),
    Feature(
        name="processes",
        default=True,
        description=(
            "compute, graphics and MPS process lists (_v3, _v2 when _v3 is missing or its records "
            "fail validation), validated record by record; compute process count and memory; the "
            "per-process utilization samples (last-seen timestamp) only while per-process or "
            "per-pod usage needs them and processes are visible"
        ),
        nvml_functions=(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v2",
            "nvmlDeviceGetProcessUtilization",
            "nvmlDeviceGetMemoryInfo",
        ),
    ),
    Feature(
        name="process_usage",
        default=False,
        description=(
            "per-process series (memory, SM/memory/encoder/decoder utilization; pid, name, pod) "
            "from the processes feature's lists; off by default: one series set per process, "
            "NVGPU_PROCESS_SERIES_PER_GPU at most per GPU plus one summing the rest"
        ),
        nvml_functions=(),
    ),
    Feature(
        name="events",
        default=True,
        description="NVML event thread: Xid critical errors, ECC, P-state and other device events",
        nvml_functions=(
            "nvmlEventSetCreate",
            "nvmlDeviceGetSupportedEventTypes",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait_v2",
        ),
    ),
    Feature(
        name="kernel_xid",
        default=False,
        description=(
            "Xid errors parsed from the kernel log; off by default because it reads /dev/kmsg "
            "(needs the host's kernel log and privileges)"
        ),
        nvml_functions=(),
    ),
    Feature(
        name="pod_attribution",
        default=True,
        description="GPU to pod/container mapping from the kubelet PodResources v1 List API",
        nvml_functions=(),
    ),
)
"""Every feature, in the order the exporter reports them. Read-only."""
