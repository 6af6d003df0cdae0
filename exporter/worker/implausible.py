"""Where the worker applies each collector's plausibility checks, counts what they drop, and says so once.

One call per collector and pass (:func:`checked`, from the GPU's sampling thread right after the
collector's ``read()``) runs the collector's declared ``CHECKS``
(:mod:`exporter.common.plausibility`) over its reading, with the counters' bases of this GPU's
device client. What fails is counted in the GPU's :class:`~exporter.common.plausibility.Dropped`
state, as are the drops counted where they are found (:func:`count`: a join between two NVML answers
that does not match, a field value stamped in the future). At the end of the pass :func:`report`
logs the first drop of each (feature, reason) on this GPU once, WARNING, with the value, what it
was checked against and the versions that matter for a driver or binding bug (GPU model, driver,
nvidia-ml-py), and returns the counts the snapshot carries (``GpuSample.dropped``, rendered as
``nvgpu_readings_dropped_total``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.common import plausibility
from exporter.common.gpustate import GpuState, Lifetime
from exporter.common.logs import log_once

if TYPE_CHECKING:
    from exporter.common.collectors.base import Collector
    from exporter.worker.nvml.client import DeviceClient

log = logging.getLogger("exporter.worker")


@dataclass
class Versions(GpuState):
    """(GPU model, driver version, nvidia-ml-py version) for the log lines, read at the first drop."""

    LIFETIME = Lifetime.WORKER
    versions: tuple[str, str, str] | None = None


def checked(dev: DeviceClient, feature: str, collector: Collector, reading: Any) -> Any:
    """The collector's ``reading`` with every value that fails its ``CHECKS`` dropped (None when the
    whole reading had to go); drops counted in the GPU's state."""
    if reading is None or not collector.CHECKS:
        return reading
    bases = dev.state_of(plausibility.Bases).by_feature.setdefault(feature, {})
    ctx = plausibility.Context(now=dev.client.now(), bases=bases)
    out = plausibility.apply(collector.CHECKS, reading, ctx)
    state = dev.state_of(plausibility.Dropped)
    for drop in ctx.drops:
        state.add(feature, drop)
    state.restarted.extend((feature, where, old, new) for where, old, new in ctx.restarts)
    return out


def count(dev: DeviceClient, feature: str, reason: str, where: str, value: Any, why: str, n: int = 1) -> None:
    """Count ``n`` values dropped where they were found (not by a declared check): a join between two
    NVML answers that does not match. ``where``, ``value`` and ``why`` describe the first, for the log."""
    dev.state_of(plausibility.Dropped).add(feature, plausibility.Drop(reason, where, value, why), n)


def report(dev: DeviceClient) -> dict[str, dict[str, int]]:
    """Log what this GPU dropped for the first time (once per feature and reason, with the versions)
    and counters restarted; return feature -> reason -> count since the worker started."""
    state = dev.state_of(plausibility.Dropped)
    if state.unlogged or state.restarted:
        model, driver, binding = _versions(dev)
        for feature, drop in state.unlogged:
            _log_drop(dev, feature, drop, model, driver, binding)
        for feature, where, old, new in state.restarted:
            log_once(
                log,
                logging.INFO,
                ("counter-restarted", dev.uuid, feature, where),
                "GPU %s: counter %s %s restarted at %g (was %g): %d samples in a row agree, accepted as its "
                "new base (Prometheus sees one counter reset)",
                dev.uuid,
                feature,
                where,
                new,
                old,
                plausibility.CONFIRM_SAMPLES,
                extra={"uuid": dev.uuid, "feature": feature, "field": where},
            )
        state.unlogged.clear()
        state.restarted.clear()
    return state.by_feature()


def _log_drop(dev: DeviceClient, feature: str, drop: plausibility.Drop, model: str, driver: str, binding: str) -> None:
    log_once(
        log,
        logging.WARNING,
        ("implausible", dev.uuid, feature, drop.reason),
        "GPU %s (%s): %s %s = %r cannot be true (%s, %s); dropped and counted in "
        "nvgpu_readings_dropped_total{feature=%r,reason=%r}, said once per GPU, feature and reason. "
        "Driver %s, nvidia-ml-py %s",
        dev.uuid,
        model,
        feature,
        drop.where,
        drop.value,
        drop.reason,
        drop.why,
        feature,
        drop.reason,
        driver,
        binding,
        extra={
            "uuid": dev.uuid,
            "gpu": dev.index,
            "feature": feature,
            "field": drop.where,
            "reason": drop.reason,
            "gpu_model": model,
            "driver_version": driver,
            "nvidia_ml_py_version": binding,
        },
    )


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return "".join(ch for ch in str(value) if ch.isprintable()).strip() or "unknown"


def _versions(dev: DeviceClient) -> tuple[str, str, str]:
    """(GPU model, driver, nvidia-ml-py), read once per GPU; "unknown" where unreadable."""
    state = dev.state_of(Versions)
    if state.versions is None:
        found = []
        for function, args in (("nvmlDeviceGetName", (dev.handle,)), ("nvmlSystemGetDriverVersion", ())):
            try:
                found.append(_text(dev.client.raw("identity", function, dev.uuid, *args)))
            except Exception:  # noqa: BLE001 - informational; Stopping is a BaseException and propagates
                found.append("unknown")
        try:
            binding = _text(dev.client.backend.binding_version() or "unknown")
        except Exception:  # noqa: BLE001 - informational
            binding = "unknown"
        state.versions = (found[0], found[1], binding)
    return state.versions
