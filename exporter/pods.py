"""The ``pod_attribution`` feature: GPU UUID -> namespace/pod/container from the kubelet.

A supervisor extension (:mod:`exporter.extensions`). Every ``NVGPU_POD_REFRESH_SECONDS`` it asks
the kubelet's PodResources v1 ``List`` (in a thread: a blocking gRPC call with a deadline) which
containers hold which GPU, and re-renders only when the answer changed. It exports one
``nvgpu_gpu_pod_info`` series per container per GPU; with ``NVGPU_POD_LABELS=true`` it also adds
``namespace``/``pod``/``container`` to every per-GPU series of a GPU held by exactly one container
(empty values for a shared or free GPU: join ``nvgpu_gpu_pod_info`` for those).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.extensions import Extension, Host
from exporter.metric import GpuKey, MetricDef, single
from guards import features as gf

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.config import Config
    from exporter.podresources import PodRef
    from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)

GPU_POD_INFO = MetricDef(
    "nvgpu_gpu_pod_info",
    "Pods holding the GPU (kubelet PodResources List); one series per container; value is always 1",
    ("namespace", "pod", "container"),
)
POD_ATTRIBUTION_UP = MetricDef(
    "nvgpu_pod_attribution_up", "1 if the kubelet PodResources socket answered the last List", per_gpu=False
)
METRICS = (GPU_POD_INFO, POD_ATTRIBUTION_UP)


def _level() -> int:
    """WARNING in a Kubernetes pod (a missing kubelet socket is a deployment fault there), INFO
    elsewhere (a workstation or a bare-metal host has no kubelet: pod attribution is moot)."""
    return logging.WARNING if os.environ.get("KUBERNETES_SERVICE_HOST") else logging.INFO


class PodAttribution(Extension):
    """Pod attribution (see the module docstring)."""

    feature = "pod_attribution"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.relabels_gpus = config.pod_labels
        self.assignments: dict[str, tuple[PodRef, ...]] = {}
        self.up: bool | None = None
        self._last_error: str | None = None

    def gpu_labels(self, uuid: str) -> tuple[str, str, str]:
        """(namespace, pod, container) when exactly one container holds the GPU, else empty."""
        refs = self.assignments.get(uuid, ())
        if len(refs) == 1:
            r = refs[0]
            return (r.namespace, r.pod, r.container)
        return ("", "", "")

    def gpu_families(self, snapshot: Snapshot) -> Iterable[Metric]:
        info = GPU_POD_INFO.family()
        index = {g.uuid: str(g.index) for g in snapshot.gpus}
        for uuid, refs in sorted(self.assignments.items()):
            if uuid not in index:
                continue
            for r in refs:
                info.add(GpuKey(index[uuid], uuid), 1, r.namespace, r.pod, r.container)
        return [info.always()]

    def self_families(self) -> Iterable[Metric]:
        return [single(POD_ATTRIBUTION_UP, None if self.up is None else int(self.up))]

    async def run(self, host: Host) -> None:
        from exporter.podresources import PodResourcesClient, PodResourcesError, unsupported_reason

        reason = unsupported_reason()
        if reason is not None:
            self.up = False
            host.set_feature_state(gf.FeatureState(self.feature, False, gf.Reason.UNSUPPORTED, reason))
            log.log(_level(), "pod_attribution unsupported: %s", reason)
            host.changed()
            return
        client = PodResourcesClient(self.config.pod_resources_socket, timeout_s=min(5.0, self.config.pod_refresh_s))
        try:
            while True:
                before = (self.up, self.assignments)
                try:
                    self.assignments = await asyncio.to_thread(client.list_gpu_assignments)
                    if self.up is False:
                        log.info("pod_attribution: kubelet socket %s answers again", self.config.pod_resources_socket)
                    self.up, self._last_error = True, None
                except PodResourcesError as exc:
                    if self._last_error != str(exc):
                        # Outside Kubernetes there is no kubelet to ask: expected, said at INFO.
                        level = _level() if exc.reason == "socket_missing" else logging.WARNING
                        log.log(level, "pod_attribution: %s; nvgpu_pod_attribution_up is 0, nothing else changes", exc)
                    self.up, self._last_error = False, str(exc)
                    self.assignments = {}
                if (self.up, self.assignments) != before:
                    host.changed()  # re-render only when something changed
                await asyncio.sleep(self.config.pod_refresh_s)
        finally:
            client.close()
