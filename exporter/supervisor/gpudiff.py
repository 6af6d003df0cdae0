"""Per-GPU changes between snapshots, as timeline events (for :mod:`exporter.supervisor.recorder`).

For each GPU of a snapshot, by UUID, what differs from the last value the timeline holds (kept in
its file, so a change while the exporter was away is seen too): its state, ECC counts, row
remapping, NVIDIA's recovery action, the fabric registration, MIG mode, the pods the kubelet
assigned it to, its index or PCI bus id. The first sighting of a GPU records its state, not its
counters. A GPU that was lost or hung and answers again, or whose volatile ECC counts fell (they
restart at a reset or a driver reload, nvmlDeviceGetTotalEccErrors), is a ``reset``, and the
recovery watches are told.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from exporter.common.collectors import ecc, fabric, identity, mig, remapped_rows
from exporter.supervisor.recovery import RecoveryTracker
from exporter.supervisor.timeline import Timeline

if TYPE_CHECKING:
    from exporter.common.snapshot import GpuSample
    from exporter.supervisor.gpuhealth import GpuHealth

E = TypeVar("E")
AWAY = ("lost", "hung")  # a GPU back from these answered again: a reset or a recovery


class ServedState(Protocol):
    """What the changes read of the served state (:class:`exporter.supervisor.served.ServedState`)."""

    health: GpuHealth

    def extension(self, kind: type[E]) -> E | None: ...


class GpuChanges:
    """Turns each GPU's snapshot into the events of what changed (see the module docstring).

    Args:
        timeline: where the events go (and the last values are kept).
        recovery: told of resets.
    """

    def __init__(self, timeline: Timeline, recovery: RecoveryTracker) -> None:
        self.timeline = timeline
        self.recovery = recovery

    def gpu(self, g: GpuSample, state: ServedState) -> None:
        """What changed on GPU ``g`` since the last snapshot the timeline saw of it."""
        tl, gpu = self.timeline, str(g.index)
        lane = tl.lane(g.uuid)
        ident = g.reading(identity.Reading)
        seen: dict[str, Any] = {"index": gpu}
        if ident is not None:
            seen.update(
                pci_bus_id=ident.pci_bus_id,
                serial=ident.serial,
                name=ident.name,
                vbios=ident.vbios_version,
                inforom=ident.inforom_version,
            )
        moved = {
            k: (lane.identity[k], seen[k]) for k in ("index", "pci_bus_id") if lane.identity.get(k) and seen.get(k)
        }
        moved = {k: ab for k, ab in moved.items() if ab[0] != ab[1]}
        if moved:
            text = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in moved.items())
            tl.add("identity", g.uuid, f"GPU {text}", {k: b for k, (_a, b) in moved.items()}, gpu=gpu)
        lane.identity.update({k: v for k, v in seen.items() if v})
        rec = state.health.by_key(g.uuid)
        current = state.health.state_of(rec, True) if rec is not None else g.state
        self._change(
            lane.last,
            g.uuid,
            gpu,
            "state",
            current,
            f"state {lane.last.get('state') or 'new'} -> {current}",
            {"from": lane.last.get("state"), "to": current, "detail": g.detail, "error": g.error},
        )
        if g.up:
            self._readings(lane.last, g, gpu)
        pods = self._pods(state, g.uuid)
        if pods is not None:
            self._change(lane.last, g.uuid, gpu, "pods", pods, "pods: " + (", ".join(pods) or "none"), {"pods": pods})

    def _change(self, last: dict[str, Any], uuid: str, gpu: str, kind: str, value: Any, text: str, data: Any) -> bool:
        """Record ``kind`` when ``value`` differs from the last one seen (the first sighting of a GPU
        records its state, not its counters); returns whether it did."""
        before = last.get(kind)
        if before == value:
            return False
        last[kind] = value
        self.timeline.changed()
        if before is None and kind != "state":
            return False
        self.timeline.add(kind, uuid, text, data, gpu=gpu)
        if kind == "state" and before in AWAY and value == "up":
            self.timeline.add("reset", uuid, f"GPU answers again after being {before}", {"after": before}, gpu=gpu)
            self.recovery.action("gpu_reset", f"the GPU answers again after being {before}", uuid, gpu)
        return True

    def _readings(self, last: dict[str, Any], g: GpuSample, gpu: str) -> None:
        errors = g.reading(ecc.Reading)
        if errors is not None:
            counts = [
                errors.volatile.get("uncorrected"),
                errors.volatile.get("corrected"),
                errors.aggregate.get("uncorrected"),
            ]
            before = last.get("ecc")
            text = f"ECC volatile uncorrected {counts[0]}, corrected {counts[1]}; aggregate uncorrected {counts[2]}"
            data = {
                "volatile_uncorrected": counts[0],
                "volatile_corrected": counts[1],
                "aggregate_uncorrected": counts[2],
            }
            if self._change(last, g.uuid, gpu, "ecc", counts, text, data) and isinstance(before, list):
                fell = [
                    a for a, b in zip(before[:2], counts[:2], strict=False) if a is not None and b is not None and b < a
                ]
                if fell:
                    self.timeline.add(
                        "reset", g.uuid, "volatile ECC counts fell: a GPU reset or a driver reload", data, gpu=gpu
                    )
                    self.recovery.action("gpu_reset", "the GPU's volatile ECC counts fell (a reset)", g.uuid, gpu)
        rows = g.reading(remapped_rows.Reading)
        if rows is not None:
            remap = [rows.pending, rows.failure, rows.correctable, rows.uncorrectable]
            text = (
                f"row remap pending {rows.pending}, failure {rows.failure}; remapped rows {rows.correctable} "
                f"correctable, {rows.uncorrectable} uncorrectable"
            )
            self._change(
                last,
                g.uuid,
                gpu,
                "row_remap",
                remap,
                text,
                {
                    "pending": rows.pending,
                    "failure": rows.failure,
                    "correctable": rows.correctable,
                    "uncorrectable": rows.uncorrectable,
                },
            )
            action = rows.recovery_action
            self._change(
                last, g.uuid, gpu, "recovery_action", action, f"NVIDIA recovery action {action}", {"value": action}
            )
        link = g.reading(fabric.Reading)
        if link is not None:
            self._change(
                last,
                g.uuid,
                gpu,
                "fabric",
                [link.state, link.status],
                f"fabric state {link.state}, status {link.status}",
                {"state": link.state, "status": link.status},
            )
        layout = g.reading(mig.Reading)
        if layout is not None:
            modes = [layout.current_mode, layout.pending_mode]
            self._change(
                last,
                g.uuid,
                gpu,
                "mig",
                modes,
                f"MIG mode {layout.current_mode}, pending {layout.pending_mode}",
                {"current": layout.current_mode, "pending": layout.pending_mode},
            )

    def _pods(self, state: ServedState, uuid: str) -> list[str] | None:
        from exporter.supervisor.pods import PodAttribution

        ext = state.extension(PodAttribution)
        if ext is None or ext.up is not True:
            return None
        return sorted(f"{r.namespace}/{r.pod}/{r.container}" for r in ext.assignments.get(uuid, ()))
