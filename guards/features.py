"""Feature registry, environment switches and effective feature state.

A *feature* is a named group of NVML queries (docs/design.md, "Features and guards"). Every feature has
a default, an environment switch ``NVGPU_FEATURE_<NAME>=auto|on|off`` and an effective state that
is exported as ``nvgpu_feature_enabled{feature, reason}`` (docs/metrics.md).

Precedence used by `resolve` (first matching row wins; safety first)::

    mode  quarantined  unsupported  known issue | enabled  reason
    off   any          any          any         | no       env          operator said off
    on    yes          any          any         | no       quarantined  crash evidence beats ON
    auto  yes          any          any         | no       quarantined
    on    no           yes          any         | no       unsupported  no GPU can answer it
    auto  no           yes          any         | no       unsupported
    on    no           no           any         | yes      env          documented override of a
                                                                         known-issue rule
    auto  no           no           yes         | no       known_issue
    auto  no           no           no          | default  default

Why this order:

* ``off`` is always honoured: turning a query off can never crash anything.
* Quarantine is evidence that the worker on *this* node died inside this feature. An explicit
  ``on`` does not override it: the operator's ``on`` was written before that evidence existed, and
  re-enabling a feature that kills the worker only brings the crash loop back. Quarantine is lifted
  by the supervisor's own quarantine handling (state file / ``quarantine`` command), not by env.
* Unsupported means no GPU on the node implements the feature; ``on`` cannot change hardware.
* ``on`` beats a known-issue rule: that is the documented override once a driver or binding fix
  lands (e.g. ``NVGPU_FEATURE_NVLINK_THROUGHPUT=on``; known_issues.json cites it per rule).
* ``auto`` means: on unless a known-issue rule applies, then the feature's default.

Sources: docs/design.md ("Features and guards", "Why it exists"), docs/metrics.md (which feature
owns which metric and its NVML source), nvml.h (function names).
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "ENV_PREFIX",
    "FEATURES",
    "Feature",
    "FeatureState",
    "Mode",
    "Reason",
    "env_var",
    "parse_feature_env",
    "resolve",
]

ENV_PREFIX = "NVGPU_FEATURE_"
"""Prefix of the per-feature environment switches; the suffix is the upper-case feature name."""


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


class Mode(str, enum.Enum):
    """Operator's setting of ``NVGPU_FEATURE_<NAME>``."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Reason(str, enum.Enum):
    """Why a feature is in its effective state; the ``reason`` label of nvgpu_feature_enabled."""

    DEFAULT = "default"
    ENV = "env"
    KNOWN_ISSUE = "known_issue"
    QUARANTINED = "quarantined"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class FeatureState:
    """Effective state of one feature.

    Attributes:
        feature: Feature name (a key of `FEATURES`).
        enabled: Whether the worker may run the feature's queries.
        reason: Which precedence row decided (see the module docstring).
        detail: Human explanation for logs, e.g. the known-issue reason and reference.
    """

    feature: str
    enabled: bool
    reason: Reason
    detail: str


_ACCEPTED = ", ".join(mode.value for mode in Mode)
_NO_DETAILS: Mapping[str, str] = MappingProxyType({})


def env_var(feature: str) -> str:
    """Return the environment variable that switches ``feature``.

    Args:
        feature: A feature name, e.g. ``"nvlink_throughput"``.

    Returns:
        ``"NVGPU_FEATURE_NVLINK_THROUGHPUT"``. The name is not checked against `FEATURES`.
    """
    return ENV_PREFIX + feature.upper()


def parse_feature_env(environ: Mapping[str, str]) -> tuple[dict[str, Mode], list[str]]:
    """Read every ``NVGPU_FEATURE_<NAME>`` switch from an environment mapping.

    Values are ``auto``, ``on`` or ``off``, case-insensitive, surrounding whitespace ignored. An
    empty value is an error (not "unset"), like any other value outside those three. Any variable
    whose name starts with ``NVGPU_FEATURE`` but is not one of the valid switches is an error
    naming the closest valid variable (typos such as ``NVGPU_FEATURES_NVLINK`` included).

    Args:
        environ: Environment, e.g. ``os.environ``; other variables are ignored.

    Returns:
        ``(modes, errors)``: ``modes`` maps every name in `FEATURES` (registry order) to its
        `Mode`, ``Mode.AUTO`` when unset or invalid; ``errors`` is one human message per problem,
        sorted by variable name, empty when all is well. Never raises for bad input: the caller
        reports all problems at once (docs/design.md, "Failure model": "bad config / env" exits 2).
    """
    modes: dict[str, Mode] = dict.fromkeys(FEATURES, Mode.AUTO)
    errors: list[str] = []
    valid_vars = {env_var(name): name for name in FEATURES}
    for key in sorted(environ):
        if not key.upper().startswith(ENV_PREFIX.rstrip("_")):
            continue
        name = valid_vars.get(key)
        if name is None:
            errors.append(_unknown_variable_message(key, list(valid_vars)))
            continue
        raw = environ[key]
        try:
            modes[name] = Mode(raw.strip().lower())
        except ValueError:
            errors.append(f"{key}={raw!r}: invalid value; accepted values are {_ACCEPTED}")
    return modes, errors


def _unknown_variable_message(key: str, valid_vars: list[str]) -> str:
    if key.upper() in valid_vars:
        suggestion: str | None = key.upper()
    else:
        close = difflib.get_close_matches(key.upper(), valid_vars, n=1, cutoff=0.6)
        suggestion = close[0] if close else None
    hint = f"; did you mean {suggestion}?" if suggestion else ""
    return f"{key}: unknown feature switch{hint} (valid: {', '.join(valid_vars)}; values {_ACCEPTED})"


def resolve(
    modes: Mapping[str, Mode],
    *,
    known_issues: Mapping[str, str] = _NO_DETAILS,
    quarantined: Mapping[str, str] = _NO_DETAILS,
    unsupported: Mapping[str, str] = _NO_DETAILS,
) -> dict[str, FeatureState]:
    """Decide the effective state of every feature (precedence: see the module docstring).

    Args:
        modes: Feature name -> `Mode`, as returned by `parse_feature_env`; a feature missing
            from it counts as ``Mode.AUTO``.
        known_issues: Feature name -> detail for known-issue rules that match this node
            (`guards.known_issues.match_known_issues`).
        quarantined: Feature name -> detail (crash evidence: signal, function, count, since)
            for features the supervisor quarantined on this node.
        unsupported: Feature name -> detail for features no GPU on this node supports.

    Returns:
        Feature name -> `FeatureState`, one entry per feature in `FEATURES` order.

    Raises:
        ValueError: A key of any argument is not a feature name (a misspelled quarantine entry
            must not silently leave a crashing feature enabled); all unknown names are listed.
    """
    unknown = sorted(
        {
            name
            for mapping in (modes, known_issues, quarantined, unsupported)
            for name in mapping
            if name not in FEATURES
        }
    )
    if unknown:
        raise ValueError(f"unknown feature name(s) {', '.join(unknown)}; valid: {', '.join(FEATURES)}")
    states: dict[str, FeatureState] = {}
    for name, feature in FEATURES.items():
        mode = Mode(modes.get(name, Mode.AUTO))
        var = env_var(name)
        state: FeatureState
        if mode is Mode.OFF:
            state = FeatureState(name, False, Reason.ENV, f"{var}=off")
        elif name in quarantined:
            detail = quarantined[name]
            if mode is Mode.ON:
                detail += f" ({var}=on is ignored while the feature is quarantined)"
            state = FeatureState(name, False, Reason.QUARANTINED, detail)
        elif name in unsupported:
            state = FeatureState(name, False, Reason.UNSUPPORTED, unsupported[name])
        elif mode is Mode.ON:
            detail = f"{var}=on"
            if name in known_issues:
                detail += f" overrides known issue: {known_issues[name]}"
            state = FeatureState(name, True, Reason.ENV, detail)
        elif name in known_issues:
            state = FeatureState(name, False, Reason.KNOWN_ISSUE, known_issues[name])
        elif feature.default:
            state = FeatureState(name, True, Reason.DEFAULT, "on by default")
        else:
            state = FeatureState(name, False, Reason.DEFAULT, f"off by default; enable with {var}=on")
        states[name] = state
    return states
