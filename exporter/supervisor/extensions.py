"""Supervisor-side extensions: concerns that are not NVML but feed on snapshots or add series.

The stuck-context signature (:mod:`exporter.supervisor.stuck`), kernel-log Xids
(:mod:`exporter.supervisor.kernel_xid`), pod attribution (:mod:`exporter.supervisor.pods`) and the
HTTP edge's counters (:mod:`exporter.supervisor.http.httpedge`) are extensions. Each subclasses
:class:`Extension` and overrides what it needs; the composition root (:mod:`exporter.app`) builds
them, and the supervisor calls every hook of every extension whose feature is on (the worker's
decision: an extension of a feature it turns off, a known-issue rule, gets no hook and no render
call, and its background work is cancelled), so nothing is wired by
overwriting attributes. An extension talks back only through the :class:`Host` it is given in
:meth:`Extension.run` (the served state implements it). Hooks run on the event loop and must not
block: blocking reads go to a thread: the kernel log and the web config to a daemon thread of their own
(:class:`exporter.common.fileio.Runner`, never joined at shutdown), the kubelet's gRPC call through
``asyncio.to_thread``.
This module is the interface only: it imports no extension.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exporter.common.metric import Family as Metric
    from exporter.common.metric import MetricDef
    from exporter.common.snapshot import Snapshot
    from guards.features import FeatureState


class Host(Protocol):
    """What an extension may ask of the supervisor."""

    @property
    def snapshot(self) -> Snapshot | None:
        """The last snapshot (fresh or not), None before the first."""

    def changed(self) -> None:
        """The exposition must be rendered again (coalesced)."""

    def record_xid(
        self, gpu: str, uuid: str, xid: int, ts: float, source: str, pid: int | None = None, process: str = ""
    ) -> None:
        """Count one Xid (see :meth:`exporter.supervisor.xids.XidLedger.record_xid`), with the process
        the kernel log names when it does."""

    def attribute_xid(self, uuid: str, xid: int, ts: float, pid: int | None, process: str) -> None:
        """The kernel log's record of an Xid already counted from an NVML event names its process
        (see :meth:`exporter.supervisor.xids.XidLedger.attribute`)."""

    def set_feature_state(self, state: FeatureState) -> None:
        """Override the effective state of the extension's feature (e.g. unsupported: no socket)."""


class Extension:
    """Base class: every hook is a no-op until overridden.

    Attributes:
        feature: the feature (``guards.featuretable.FEATURES``) this extension serves, or "" when it
            is always on (the stuck signature).
        relabels_gpus: True when :meth:`gpu_labels` adds labels to every per-GPU series.
        metrics: the families it may emit; when building them raises, these are counted as
            dropped (``nvgpu_render_errors_total``).
    """

    feature = ""
    relabels_gpus = False
    metrics: tuple[MetricDef, ...] = ()

    @property
    def component(self) -> str:
        """Its name where its failures are counted (``nvgpu_supervisor_errors_total``)."""
        return f"extension:{self.feature or type(self).__name__}"

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot arrived from the worker (called before rendering)."""

    def accept_xid(self, uuid: str, xid: int, ts: float) -> bool:
        """Whether an Xid from an NVML event should be counted (False: already counted elsewhere)."""
        return True

    def gpu_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        """Per-GPU families for a fresh snapshot."""
        return ()

    def self_families(self) -> Iterable[Metric]:
        """Exporter-level families (rendered with or without a snapshot)."""
        return ()

    def gpu_count_views(self) -> dict[str, int]:
        """Views of ``nvgpu_gpus`` this extension knows (view -> count; see
        :data:`exporter.supervisor.gpuhealth.COUNT_VIEWS`); empty by default."""
        return {}

    def gpu_labels(self, uuid: str) -> tuple[str, str, str]:
        """(namespace, pod, container) for a GPU, when :attr:`relabels_gpus` is set."""
        return ("", "", "")

    async def run(self, host: Host) -> None:
        """Background work while the feature is on (returns at once by default); cancelled when the
        worker decides the feature off."""
