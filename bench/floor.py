"""The raw NVML floor: a plain pynvml loop making the same calls as our worker's default features.

bench/peer.py compares our worker's time per sample (``nvgpu_sample_duration_seconds``) with this loop.
It imports nothing from the exporter (except the fake backend for ``--fake``): the calls are
listed here by hand from ``exporter/common/collectors/*.py`` and ``exporter/worker/main.py``, in the worker's
order (GPU by GPU, feature by feature), in their steady state, i.e. after the first sample:

The default features since the series budget (2026-11-30: ``details`` and ``nvlink_links`` off); the
NVLink error counters at the worker's cadence: the batched fields every sample, the per-call data
CRC counters every :data:`SLOW_EVERY` samples (30 s at the default 5 s interval), so that the floor
and the worker make the same calls in the same mix of samples.

* discovery, once (not timed): ``nvmlInit``, ``nvmlDeviceGetCount``, per GPU
  ``nvmlDeviceGetHandleByIndex`` and ``nvmlDeviceGetUUID``; identity (``GetName``, ``GetPciInfo``,
  ``GetSerial``, ``GetArchitecture``: cached by the worker); ``GetMaxClockInfo(SM)`` (cached);
  ``GetNumFans`` (H200: NOT_SUPPORTED, so the fan feature is off); NVLink links probed with
  ``GetNvLinkState(link)`` from link 0 until the driver says no; field 91
  (``NVML_FI_DEV_NVLINK_LINK_COUNT``) for the throughput link count.
  Every call or field entry that answers an "unsupported" code (NOT_SUPPORTED, FUNCTION_NOT_FOUND,
  ARGUMENT_VERSION_MISMATCH, NO_PERMISSION, DEPRECATED, VGPU_ECC_NOT_SUPPORTED; INVALID_ARGUMENT
  for per-index calls) is dropped, as the worker never repeats those.
* per sample, per GPU (timed):

  - utilization: ``GetUtilizationRates``
  - memory: ``GetMemoryInfo(version=nvmlMemory_v2)`` (v1 if v2 is unsupported)
  - power: ``GetPowerUsage``, ``GetEnforcedPowerLimit``, ``GetTotalEnergyConsumption``,
    ``nvmlDeviceGetFieldValues([(185, 1), (185, 2)])`` (module and memory power, the scopes that answer)
  - temperature: ``GetTemperatureV(NVML_TEMPERATURE_GPU)`` (``GetTemperature`` if absent),
    ``nvmlDeviceGetFieldValues([(82, 0)])`` (memory temperature)
  - fan: ``GetFanSpeed_v2(fan)`` per fan, only where ``GetNumFans`` answered > 0
  - clocks: ``GetClockInfo`` x2 (sm, memory)
  - throttle_time: ``nvmlDeviceGetFieldValues`` with fields 74, 75, 81 and, from driver 580.82,
    269-271 (``nvmlSystemGetDriverVersion`` once, in discovery)
  - pcie: ``GetCurrPcieLinkGeneration``, ``GetCurrPcieLinkWidth``, ``GetPcieReplayCounter``
  - ecc: ``GetEccMode``; when enabled ``GetTotalEccErrors(type, NVML_VOLATILE_ECC)`` x2
  - remapped_rows: ``GetRemappedRows``, ``nvmlDeviceGetFieldValues([(230, 0)])``
  - nvlink: per link ``GetNvLinkState(link)``; one ``nvmlDeviceGetFieldValues`` with (161, link),
    (162, link), (163, link) per link; every :data:`SLOW_EVERY` samples ``GetNvLinkErrorCounter(link,
    3)`` per link (data CRC), and counters 0-2 by call for links whose fields are unsupported
  - nvlink_throughput: one ``nvmlDeviceGetFieldValues`` with (138, 0xFFFFFFFF), (139, 0xFFFFFFFF)
    (per link where the driver refuses the all-links scope)
  - fabric: ``nvmlDeviceGetGpuFabricInfoV(handle, byref(v3 struct))``
  - gpm: ``nvmlGpmSampleGet`` into one of two buffers (allocated in discovery, with
    ``nvmlGpmQueryDeviceSupport`` and ``nvmlDeviceGetMigMode``), ``nvmlGpmMetricsGet`` for the
    gpm feature's seven metrics between it and the previous sample (NVLink traffic only while
    nvlink_throughput is off; ``gpm_pipes`` is off by default)
  - processes: ``Get{Compute,Graphics,MPSCompute}RunningProcesses_v3`` (``_v2`` if absent)

Not included: the worker's NVML event thread (``nvmlEventSetWait_v2``, 1 s timeout, outside the
sample), the known-issue check and the JSON message (after the sample's clock stops).

Usage::

    python bench/floor.py [--samples 20] [--spacing 0.25] [--json]
    python bench/floor.py --fake examples/scenarios/h200x2.json   # logic check without a GPU

Exit status 0, or 2 when NVML cannot be initialised (no GPU, no driver): the message says so and
``--json`` prints ``{"error": …}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NVML_MEMORY_V2 = 0x02000028
NVML_TEMPERATURE_GPU = 0
FIELD_MEMORY_TEMP = 82
FIELD_RECOVERY_ACTION = 230
FIELD_NVLINK_LINK_COUNT = 91
FIELD_NVLINK_TX = 138
FIELD_NVLINK_RX = 139
FIELDS_THROTTLE = (74, 75, 81)  # exporter/common/collectors/throttle_time.py DEFAULT_REASONS
FIELDS_THROTTLE_580_82 = (269, 270, 271)
FIELDS_POWER_SCOPES = [(185, 1), (185, 2)]
GPM_METRICS = (1, 2, 3, 5, 10, 20, 21)  # exporter/common/collectors/gpm.py, nvlink_throughput on
FIELDS_NVLINK_ERRORS = (161, 162, 163)  # DL replay, recovery, flit CRC per link (exporter/common/collectors/nvlink.py)
ALL_LINKS = 0xFFFFFFFF
SLOW_EVERY = 6  # per-call NVLink counters every 30 s = every 6th sample at the default 5 s interval
MAX_LINKS = 36
UNSUPPORTED_NAMES = (
    "NOT_SUPPORTED",
    "FUNCTION_NOT_FOUND",
    "ARGUMENT_VERSION_MISMATCH",
    "NO_PERMISSION",
    "DEPRECATED",
    "VGPU_ECC_NOT_SUPPORTED",
)


class NvmlUnavailable(RuntimeError):
    """nvmlInit failed: no driver, no library, no GPU."""


@dataclass
class Call:
    """One planned per-sample call: ``fn(handle, *args, **kwargs)`` or a field-value query."""

    feature: str
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    fields: list[tuple[int, int]] | None = None  # for nvmlDeviceGetFieldValues
    every: int = 1  # made in samples 0, every, 2 x every, ... (the worker's slow NVLink counters)


@dataclass
class GpuPlan:
    index: int
    uuid: str
    name: str
    handle: Any
    calls: list[Call] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # unsupported in discovery, never repeated


class Floor:
    """Discovery and timed samples over one NVML binding (``pynvml`` or the fake)."""

    def __init__(self, nv: Any) -> None:
        import pynvml  # return-code constants (the fake raises pynvml's NVMLError too)

        self.nv = nv
        self.unsupported_codes = {int(getattr(pynvml, f"NVML_ERROR_{n}", -1)) for n in UNSUPPORTED_NAMES} - {-1}
        self.invalid_argument = int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.success = int(pynvml.NVML_SUCCESS)
        self.gpus: list[GpuPlan] = []
        self.init_s = 0.0
        self.discovery_s = 0.0

    # -- helpers ---------------------------------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def _unsupported(self, exc: BaseException, indexed: bool) -> bool:
        if isinstance(exc, AttributeError):
            return True
        code = self._code(exc)
        return code in self.unsupported_codes or (indexed and code == self.invalid_argument)

    def _fn(self, name: str) -> Callable[..., Any] | None:
        return getattr(self.nv, name, None)

    def _try(
        self,
        plan: GpuPlan,
        feature: str,
        name: str,
        *args: Any,
        keep: bool = True,
        indexed: bool = False,
        every: int = 1,
        **kwargs: Any,
    ) -> tuple[bool, Any]:
        """Call once; plan it for every sample when it answers (or fails transiently)."""
        fn = self._fn(name)
        if fn is None:
            plan.skipped.append(f"{name} (not in binding)")
            return False, None
        try:
            value = fn(plan.handle, *args, **kwargs)
        except self.nv.NVMLError as exc:
            if self._unsupported(exc, indexed):
                plan.skipped.append(f"{name}{args or ''} ({exc})")
                return False, None
            value = None  # transient: the worker asks again next sample
        if keep:
            plan.calls.append(Call(feature, name, fn, args, kwargs, every=every))
        return True, value

    def _try_fields(
        self, plan: GpuPlan, feature: str, pairs: list[tuple[int, int]], keep: bool = True
    ) -> dict[tuple[int, int], Any]:
        fn = self._fn("nvmlDeviceGetFieldValues")
        if fn is None:
            plan.skipped.append("nvmlDeviceGetFieldValues (not in binding)")
            return {}
        try:
            entries = fn(plan.handle, pairs)
        except self.nv.NVMLError as exc:
            if self._unsupported(exc, False):
                plan.skipped.append(f"nvmlDeviceGetFieldValues{pairs[:2]}… ({exc})")
                return {}
            entries = []
        good: dict[tuple[int, int], Any] = {}
        for pair, entry in zip(pairs, entries, strict=False):
            code = int(entry.nvmlReturn)
            if code == self.success:
                good[pair] = entry
            elif code in self.unsupported_codes or code == self.invalid_argument:
                plan.skipped.append(f"field {pair[0]}:{pair[1]} (code {code})")
        wanted = [p for p in pairs if p in good] if entries else pairs
        if keep and wanted:
            plan.calls.append(Call(feature, "nvmlDeviceGetFieldValues", fn, fields=wanted))
        return good

    def _try_call(self, plan: GpuPlan, feature: str, name: str, fn: Callable[[Any], Any]) -> bool:
        """Like _try for a call this module wraps (structs the caller allocates): ``fn(handle)``."""
        try:
            fn(plan.handle)
        except self.nv.NVMLError as exc:
            if self._unsupported(exc, False):
                plan.skipped.append(f"{name} ({exc})")
                return False
        except AttributeError as exc:  # binding without the function or struct
            plan.skipped.append(f"{name} ({exc})")
            return False
        plan.calls.append(Call(feature, name, fn))
        return True

    def _gpm(self, plan: GpuPlan) -> None:
        """Two sample buffers per GPU, alternated as the worker does: SampleGet, then MetricsGet."""
        import pynvml  # the request struct (the fake takes pynvml's structs too)

        nv = self.nv
        ok, support = self._try(plan, "gpm", "nvmlGpmQueryDeviceSupport", keep=False)
        if not ok or support is None or not int(support.isSupportedDevice):
            return
        ok, mig = self._try(plan, "gpm", "nvmlDeviceGetMigMode", keep=False)
        if ok and mig is not None and int(mig[0]) == 1:
            plan.skipped.append("gpm (MIG enabled)")
            return
        buffers = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        state = {"newest": 0}
        nv.nvmlGpmSampleGet(plan.handle, buffers[0])

        def sample(handle: Any) -> Any:
            return nv.nvmlGpmSampleGet(handle, buffers[1 - state["newest"]])

        def metrics(_: Any) -> Any:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = buffers[state["newest"]], buffers[1 - state["newest"]]
            for i, metric in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric
            out = nv.nvmlGpmMetricsGet(request)
            state["newest"] = 1 - state["newest"]
            return out

        if self._try_call(plan, "gpm", "nvmlGpmSampleGet", sample):
            self._try_call(plan, "gpm", "nvmlGpmMetricsGet", metrics)

    # -- discovery -------------------------------------------------------------------------

    def init(self) -> None:
        t0 = time.perf_counter()
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        self.init_s = time.perf_counter() - t0

    def discover(self) -> None:
        t0 = time.perf_counter()
        nv = self.nv
        for index in range(int(nv.nvmlDeviceGetCount())):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = nv.nvmlDeviceGetUUID(handle)
            plan = GpuPlan(index, _text(uuid), "", handle)
            # identity (cached by the worker)
            _, name = self._try(plan, "identity", "nvmlDeviceGetName", keep=False)
            plan.name = _text(name) if name is not None else ""
            for fn in ("nvmlDeviceGetPciInfo", "nvmlDeviceGetSerial", "nvmlDeviceGetArchitecture"):
                self._try(plan, "identity", fn, keep=False)
            # utilization
            self._try(plan, "utilization", "nvmlDeviceGetUtilizationRates")
            # memory
            ok, _ = self._try(plan, "memory", "nvmlDeviceGetMemoryInfo", version=NVML_MEMORY_V2)
            if not ok:
                self._try(plan, "memory", "nvmlDeviceGetMemoryInfo")
            # power
            for fn in (
                "nvmlDeviceGetPowerUsage",
                "nvmlDeviceGetEnforcedPowerLimit",
                "nvmlDeviceGetTotalEnergyConsumption",
            ):
                self._try(plan, "power", fn)
            self._try_fields(plan, "power", list(FIELDS_POWER_SCOPES))
            # temperature
            ok, _ = self._try(plan, "temperature", "nvmlDeviceGetTemperatureV", NVML_TEMPERATURE_GPU)
            if not ok:
                self._try(plan, "temperature", "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)
            self._try_fields(plan, "temperature", [(FIELD_MEMORY_TEMP, 0)])
            # fan
            ok, fans = self._try(plan, "fan", "nvmlDeviceGetNumFans", keep=False)
            for fan in range(int(fans or 0) if ok else 0):
                self._try(plan, "fan", "nvmlDeviceGetFanSpeed_v2", fan, indexed=True)
            # clocks: SM and memory; the SM maximum once
            for clock in (1, 2):
                self._try(plan, "clocks", "nvmlDeviceGetClockInfo", clock, indexed=True)
            self._try(plan, "clocks", "nvmlDeviceGetMaxClockInfo", 1, keep=False, indexed=True)
            # throttle time: fields 74-81, and 269-271 from driver 580.82 (exporter/common/collectors/throttle_time.py)
            self._try_fields(plan, "throttle_time", [(f, 0) for f in FIELDS_THROTTLE + self._new_reason_fields()])
            # pcie
            for fn in (
                "nvmlDeviceGetCurrPcieLinkGeneration",
                "nvmlDeviceGetCurrPcieLinkWidth",
                "nvmlDeviceGetPcieReplayCounter",
            ):
                self._try(plan, "pcie", fn)
            # ecc
            ok, mode = self._try(plan, "ecc", "nvmlDeviceGetEccMode")
            if ok and mode is not None and int(mode[0]):
                for etype in (0, 1):  # volatile only (aggregate: details)
                    self._try(plan, "ecc", "nvmlDeviceGetTotalEccErrors", etype, 0, indexed=True)
            # remapped rows
            self._try(plan, "remapped_rows", "nvmlDeviceGetRemappedRows")
            self._try_fields(plan, "remapped_rows", [(FIELD_RECOVERY_ACTION, 0)])
            # nvlink: probe links, then state + 4 error counters per link
            links = []
            for link in range(MAX_LINKS):
                ok, _ = self._try(plan, "nvlink", "nvmlDeviceGetNvLinkState", link, keep=False, indexed=True)
                if not ok:
                    plan.skipped.pop()  # the expected end of the probe
                    break
                links.append(link)
            for link in links:
                self._try(plan, "nvlink", "nvmlDeviceGetNvLinkState", link, indexed=True)
            served: set[tuple[int, int]] = set()
            if links:
                pairs = [(fid, link) for link in links for fid in FIELDS_NVLINK_ERRORS]
                served = set(self._try_fields(plan, "nvlink", pairs))
            for link in links:
                for counter in range(4):
                    if counter < 3 and (FIELDS_NVLINK_ERRORS[counter], link) in served:
                        continue
                    self._try(
                        plan, "nvlink", "nvmlDeviceGetNvLinkErrorCounter", link, counter, indexed=True, every=SLOW_EVERY
                    )
            # nvlink throughput: link count field, then TX/RX of all links (per link if refused)
            got = self._try_fields(plan, "nvlink_throughput", [(FIELD_NVLINK_LINK_COUNT, 0)], keep=False)
            entry = got.get((FIELD_NVLINK_LINK_COUNT, 0))
            count = _field_int(entry) if entry is not None else 0
            if count > 0:
                scope = [(FIELD_NVLINK_TX, ALL_LINKS), (FIELD_NVLINK_RX, ALL_LINKS)]
                if not self._try_fields(plan, "nvlink_throughput", scope):
                    pairs = [(fid, link) for link in range(count) for fid in (FIELD_NVLINK_TX, FIELD_NVLINK_RX)]
                    self._try_fields(plan, "nvlink_throughput", pairs)

            # fabric: the v3 struct the worker tries first
            def fabric(handle: Any) -> Any:
                import ctypes

                import pynvml

                return nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(pynvml.c_nvmlGpuFabricInfo_v3_t()))

            self._try_call(plan, "fabric", "nvmlDeviceGetGpuFabricInfoV", fabric)
            # gpm
            self._gpm(plan)
            # processes: the compute, graphics and MPS lists
            for kind in ("Compute", "Graphics", "MPSCompute"):
                ok, _ = self._try(plan, "processes", f"nvmlDeviceGet{kind}RunningProcesses_v3")
                if not ok:
                    self._try(plan, "processes", f"nvmlDeviceGet{kind}RunningProcesses_v2")
            self.gpus.append(plan)
        self.discovery_s = time.perf_counter() - t0

    def _new_reason_fields(self) -> tuple[int, ...]:
        try:
            version = _text(self.nv.nvmlSystemGetDriverVersion())
        except self.nv.NVMLError:
            return ()
        parts = version.split(".")
        try:
            branch = (int(parts[0]), int(parts[1]))
        except (ValueError, IndexError):
            return ()
        return FIELDS_THROTTLE_580_82 if branch >= (580, 82) else ()

    # -- sampling --------------------------------------------------------------------------

    def sample(self, number: int = 0) -> tuple[float, dict[str, float], int, int]:
        """Timed pass ``number``; returns (seconds, seconds per feature, calls, failed calls)."""
        errors = 0
        calls = 0
        per_feature: dict[str, float] = {}
        nv_error = self.nv.NVMLError
        t_start = time.perf_counter()
        for plan in self.gpus:
            handle = plan.handle
            for call in plan.calls:
                if number % call.every:
                    continue
                t0 = time.perf_counter()
                try:
                    if call.fields is not None:
                        call.fn(handle, call.fields)
                    else:
                        call.fn(handle, *call.args, **call.kwargs)
                except nv_error:
                    errors += 1
                calls += 1
                per_feature[call.feature] = per_feature.get(call.feature, 0.0) + time.perf_counter() - t0
        return time.perf_counter() - t_start, per_feature, calls, errors

    def shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _field_int(entry: Any) -> int:
    members = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    member = members.get(int(entry.valueType), "uiVal")
    return int(getattr(entry.value, member))


def load_binding(fake: str | None = None) -> Any:
    """``pynvml`` (nvidia-ml-py), or the exporter's fake for a scenario file."""
    if fake:
        root = Path(__file__).resolve().parent.parent
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        from exporter.worker.fakenvml.binding import FakeNvml

        return FakeNvml(fake)
    import pynvml

    return pynvml


def run(
    samples: int = 20, spacing_s: float = 0.25, fake: str | None = None, warmup: int = 1, slow_every: int = SLOW_EVERY
) -> dict[str, Any]:
    """Discover, then time ``samples`` samples; median and spread in seconds.

    ``slow_every``: the per-call NVLink counters in every so many samples (the worker's 30 s divided
    by its sample interval: 6 at the default 5 s).

    Raises:
        NvmlUnavailable: nvmlInit failed.
    """
    nv = load_binding(fake)
    floor = Floor(nv)
    floor.init()
    try:
        floor.discover()
        for plan in floor.gpus:
            for call in plan.calls:
                if call.every != 1:
                    call.every = max(1, slow_every)
        for number in range(warmup):
            floor.sample(number)
        times: list[float] = []
        features: dict[str, list[float]] = {}
        calls = errors = 0
        call_counts: set[int] = set()
        for i in range(samples):
            if i and spacing_s > 0:
                time.sleep(spacing_s)
            dt, per_feature, calls, errors = floor.sample(warmup + i)
            call_counts.add(calls)
            times.append(dt)
            for k, v in per_feature.items():
                features.setdefault(k, []).append(v)
    finally:
        floor.shutdown()
    version = None
    try:
        from importlib import metadata

        version = metadata.version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 - informational
        pass
    return {
        "binding": "fake:" + fake if fake else "pynvml",
        "nvidia_ml_py_version": version,
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "calls_per_sample": len(g.calls), "skipped": g.skipped}
            for g in floor.gpus
        ],
        "samples": samples,
        "spacing_s": spacing_s,
        "warmup": warmup,
        "init_s": round(floor.init_s, 6),
        "discovery_s": round(floor.discovery_s, 6),
        "calls_per_sample": calls,
        "calls_per_sample_seen": sorted(call_counts),  # with and without the slow NVLink counters
        "slow_every": slow_every,
        "failed_calls_per_sample": errors,
        "sample_s": {
            "median": round(statistics.median(times), 6),
            "min": round(min(times), 6),
            "max": round(max(times), 6),
            "mean": round(statistics.fmean(times), 6),
            "all": [round(t, 6) for t in times],
        },
        "feature_median_s": {k: round(statistics.median(v), 6) for k, v in features.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Raw NVML floor: our worker's default NVML calls in a plain pynvml loop")
    p.add_argument("--samples", type=int, default=20, help="timed samples (median reported)")
    p.add_argument("--spacing", type=float, default=0.25, help="seconds between samples")
    p.add_argument(
        "--slow-every",
        type=int,
        default=SLOW_EVERY,
        help="samples between per-call NVLink counter reads (30 s / interval)",
    )
    p.add_argument("--fake", metavar="SCENARIO", help="use the exporter's fake NVML on a scenario (no GPU needed)")
    p.add_argument("--json", action="store_true", help="print JSON only")
    args = p.parse_args(argv)
    try:
        result = run(args.samples, args.spacing, args.fake, slow_every=args.slow_every)
    except NvmlUnavailable as exc:
        msg = f"{exc}. The floor needs a real NVIDIA GPU and driver (or --fake SCENARIO for a logic check)."
        if args.json:
            print(json.dumps({"error": msg}))
        print(f"floor.py: {msg}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    s = result["sample_s"]
    print(
        f"{len(result['gpus'])} GPU(s), {'/'.join(map(str, result['calls_per_sample_seen']))} NVML calls per sample "
        f"({result['failed_calls_per_sample']} failed); init {result['init_s'] * 1e3:.1f} ms"
    )
    print(
        f"per sample: median {s['median'] * 1e3:.3f} ms (min {s['min'] * 1e3:.3f}, max {s['max'] * 1e3:.3f}) "
        f"over {result['samples']} samples"
    )
    for k, v in sorted(result["feature_median_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {k:<18} {v * 1e3:8.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
