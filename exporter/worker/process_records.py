"""Validation of NVML process records and per-process utilization samples (worker side).

NVML's process lists (``nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses``) come back as
ctypes structs that the binding decodes with its own idea of the struct layout. When binding and
driver disagree the fields scramble silently: drivers 535.43-535.86 write a 32-byte
``nvmlProcessInfo_v3_t`` (with ``usedGpuCcProtectedMemory``) through ``_v3`` while nvidia-ml-py
reads 24-byte records, so the second record onwards starts mid-struct (pids 0 and 4294967295,
memory read from the next pid; XuehaiPan/nvitop PRs #79, #89 and #94, NVIDIA/go-nvml#75). A
binding with the fields in another order gives pid and memory swapped (pid 6498025472, 9980
bytes). Nothing in such a list may be exported as if it were true, so every record is checked
before use:

======================  =====================================================================
reason                  the record (or value) dropped
======================  =====================================================================
``malformed``           a field that is not an integer, a negative number, or an instance id
                        that is neither 0xFFFFFFFF (MIG off) nor below 64 (MIG instance ids)
``pid_zero``            pid 0 (the kernel's idle task is never a GPU process)
``pid_not_available``   pid 0xFFFFFFFF, NVML_VALUE_NOT_AVAILABLE for a 32-bit field
``pid_above_max``       a pid at or above ``/proc/sys/kernel/pid_max`` (never allocated)
``memory_above_total``  usedGpuMemory above the GPU's total memory
``duplicate``           the same (pid, GPU instance, compute instance) twice in one list
``memory_not_available``  usedGpuMemory None or 2^64-1 (NVML_VALUE_NOT_AVAILABLE: WDDM, MIG
                        parent handles): the record is KEPT, only its memory is unknown
``utilization_out_of_range``  a utilization sample with a percentage above 100
``timestamp_in_future``  a utilization sample stamped later than now (the driver stamps samples
                        with the host's clock; a later stamp is a misread field)
======================  =====================================================================

Every reason but ``memory_not_available`` means the list cannot be read as NVML wrote it
(:data:`STRUCTURAL`); the processes collector then tries the next struct version.

Pure functions over pynvml-shaped objects (attributes ``pid``, ``usedGpuMemory``,
``gpuInstanceId``, ``computeInstanceId``; samples ``pid``, ``timeStamp``, ``smUtil``,
``memUtil``, ``encUtil``, ``decUtil``); standard library only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

NOT_AVAILABLE_U32 = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE as an unsigned int; gi/ci with MIG off
NOT_AVAILABLE_U64 = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
MAX_INSTANCE_ID = 64  # GPU/compute instance ids are small (7 GPU instances on H100/H200)
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT on 64-bit: no pid_max is larger
_HUGE = 1 << 63  # no GPU holds 8 EiB: a larger byte count is never real
FUTURE_TOLERANCE_US = 5_000_000  # clock granularity; as exporter.common.plausibility.FUTURE_TOLERANCE_S

REASONS = (
    "malformed",
    "pid_zero",
    "pid_not_available",
    "pid_above_max",
    "memory_above_total",
    "duplicate",
    "memory_not_available",
    "utilization_out_of_range",
    "timestamp_in_future",
)
STRUCTURAL = frozenset(REASONS) - {"memory_not_available"}
"""Reasons that mean the list was not read the way NVML wrote it."""

KINDS = ("compute", "graphics", "mps")


@dataclass(frozen=True)
class ProcessRecord:
    """One validated process on one GPU (or MIG instance).

    Attributes:
        pid: process id as NVML reports it (the caller's PID namespace on current drivers).
        memory_bytes: usedGpuMemory in bytes; None when NVML does not know it.
        gpu_instance_id: MIG GPU instance; None when MIG is off (0xFFFFFFFF). Kept for
            per-instance attribution; not exported.
        compute_instance_id: MIG compute instance; None when MIG is off.
        kinds: the lists it appeared in (``compute``, ``graphics``, ``mps``), sorted.
    """

    pid: int
    memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    kinds: tuple[str, ...] = ("compute",)

    @property
    def key(self) -> tuple[int, int | None, int | None]:
        """(pid, GPU instance, compute instance): what makes a record unique in one list."""
        return (self.pid, self.gpu_instance_id, self.compute_instance_id)


@dataclass(frozen=True)
class UtilizationSample:
    """One ``nvmlProcessUtilizationSample_t``: percentages over the driver's sample period.

    Attributes:
        pid: process id.
        timestamp_us: CPU time of the sample, microseconds since 1970.
        sm: SM (compute) utilization, percent.
        memory: memory-controller utilization, percent.
        encoder: encoder utilization, percent.
        decoder: decoder utilization, percent.
    """

    pid: int
    timestamp_us: int
    sm: int
    memory: int
    encoder: int
    decoder: int


def _int(value: Any) -> int | None:
    """``value`` as an int, or None for anything that is not an integer (bool included)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _instance(value: Any) -> tuple[bool, int | None]:
    """(valid, instance id or None for "MIG off")."""
    v = _int(value)
    if v is None or v < 0:
        return False, None
    if v == NOT_AVAILABLE_U32:
        return True, None
    return v < MAX_INSTANCE_ID, v


def pid_problem(pid: Any, pid_max: int) -> str | None:
    """The drop reason for a pid, or None when it is plausible.

    Args:
        pid: the raw value.
        pid_max: the kernel's ``/proc/sys/kernel/pid_max``; pids are below it.
    """
    p = _int(pid)
    if p is None or p < 0:
        return "malformed"
    if p == 0:
        return "pid_zero"
    if p == NOT_AVAILABLE_U32:
        return "pid_not_available"
    if p >= pid_max:
        return "pid_above_max"
    return None


def validate_records(
    raw: Iterable[Any],
    kind: str,
    *,
    pid_max: int,
    memory_total: int | None,
    drops: Counter[str],
) -> list[ProcessRecord]:
    """Check each record of one process list; return the plausible ones.

    Args:
        raw: the list as the binding returned it (objects with pynvml's attribute names).
        kind: ``compute``, ``graphics`` or ``mps`` (stored on the records).
        pid_max: the kernel's pid_max (:data:`PID_MAX_LIMIT` when unknown).
        memory_total: the GPU's total memory in bytes, None when unknown.
        drops: reason -> count, incremented for every record (or value) dropped.

    Returns:
        The records that passed, in list order; the first of duplicates is kept.
    """
    out: list[ProcessRecord] = []
    seen: set[tuple[int, int | None, int | None]] = set()
    for rec in raw:
        reason = pid_problem(getattr(rec, "pid", None), pid_max)
        gi_ok, gi = _instance(getattr(rec, "gpuInstanceId", NOT_AVAILABLE_U32))
        ci_ok, ci = _instance(getattr(rec, "computeInstanceId", NOT_AVAILABLE_U32))
        raw_mem = getattr(rec, "usedGpuMemory", None)
        mem = _int(raw_mem)
        if reason is None and (not gi_ok or not ci_ok or (raw_mem is not None and (mem is None or mem < 0))):
            reason = "malformed"
        if reason is None and mem is not None and mem != NOT_AVAILABLE_U64:
            limit = _HUGE if memory_total is None else memory_total
            if mem > limit:
                reason = "memory_above_total"
        if reason is None:
            key = (int(rec.pid), gi, ci)
            if key in seen:
                reason = "duplicate"
            else:
                seen.add(key)
        if reason is not None:
            drops[reason] += 1
            continue
        if mem is None or mem == NOT_AVAILABLE_U64:
            drops["memory_not_available"] += 1
            mem = None
        out.append(ProcessRecord(int(rec.pid), mem, gi, ci, (kind,)))
    return out


def structural(drops: Mapping[str, int]) -> dict[str, int]:
    """The structural reasons among ``drops`` (see :data:`STRUCTURAL`), zero counts left out."""
    return {r: n for r, n in drops.items() if r in STRUCTURAL and n}


def merge(lists: Iterable[Iterable[ProcessRecord]]) -> list[ProcessRecord]:
    """One record per (pid, instances) over the compute, graphics and MPS lists.

    A process with both a compute and a graphics context is listed in both with its whole memory
    (nvidia-smi shows it once as type C+G), so the memory is the larger known value, not the sum.

    Returns:
        Records sorted by key, ``kinds`` the union of the lists they came from.
    """
    merged: dict[tuple[int, int | None, int | None], ProcessRecord] = {}
    for records in lists:
        for rec in records:
            have = merged.get(rec.key)
            if have is None:
                merged[rec.key] = rec
                continue
            known = [m for m in (have.memory_bytes, rec.memory_bytes) if m is not None]
            merged[rec.key] = replace(
                have,
                memory_bytes=max(known) if known else None,
                kinds=tuple(sorted(set(have.kinds) | set(rec.kinds))),
            )
    return [merged[k] for k in sorted(merged, key=lambda k: (k[0], k[1] or -1, k[2] or -1))]


def validate_samples(
    raw: Iterable[Any],
    *,
    pid_max: int,
    drops: Counter[str],
    now_us: int | None = None,
    rejected: set[int] | None = None,
) -> dict[int, UtilizationSample]:
    """Check per-process utilization samples; the latest sample of each pid.

    Args:
        raw: ``nvmlDeviceGetProcessUtilization`` samples (``pid``, ``timeStamp``, ``smUtil``,
            ``memUtil``, ``encUtil``, ``decUtil``).
        pid_max: the kernel's pid_max.
        drops: reason -> count, incremented for every sample dropped.
        now_us: now as NVML stamps samples (µs since 1970); a sample stamped more than
            :data:`FUTURE_TOLERANCE_US` later is dropped. Not checked when None.
        rejected: when given, gains the pid of every sample dropped (a pid that is an integer):
            its utilization this time is unknown, not 0.

    Returns:
        pid -> its sample with the largest ``timeStamp``.
    """
    out: dict[int, UtilizationSample] = {}
    for s in raw:
        reason = pid_problem(getattr(s, "pid", None), pid_max)
        values = [_int(getattr(s, name, None)) for name in ("timeStamp", "smUtil", "memUtil", "encUtil", "decUtil")]
        if reason is None and any(v is None or v < 0 for v in values):
            reason = "malformed"
        if reason is None and any(v is not None and v > 100 for v in values[1:]):
            reason = "utilization_out_of_range"
        if reason is None and now_us is not None and int(values[0] or 0) > now_us + FUTURE_TOLERANCE_US:
            reason = "timestamp_in_future"
        if reason is not None:
            drops[reason] += 1
            pid = _int(getattr(s, "pid", None))
            if rejected is not None and pid is not None:
                rejected.add(pid)
            continue
        ts, sm, mem, enc, dec = (int(v) for v in values)  # type: ignore[arg-type]
        sample = UtilizationSample(int(s.pid), ts, sm, mem, enc, dec)
        have = out.get(sample.pid)
        if have is None or sample.timestamp_us >= have.timestamp_us:
            out[sample.pid] = sample
    return out
