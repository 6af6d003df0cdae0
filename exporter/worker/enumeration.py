"""Which GPU sits at which NVML index: the worker's enumeration, read on a thread of its own.

NVML numbers GPUs by enumeration order, and the order changes while the node runs (a drained GPU
leaves and the ones after it move down one index; a hot-added one appears; a reset one comes back
with its old handles stale). The worker therefore reads, index by index, the GPU's handle and UUID
(``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetUUID``; ``nvmlDeviceGetPciInfo`` only where the UUID
cannot be read): that is two calls per GPU, made at start, when the count changes, after a lost GPU,
a reset or a bus event, and every ``enumerate_s`` (:class:`exporter.worker.sampler.Sampler`).

The reads run on the :class:`Enumerator`'s own thread (breadcrumb slot ``SLOT_ENUMERATION``), never
on the main thread: a GPU whose calls hang costs an unfinished enumeration (:attr:`Enumeration.hung_at`),
not the snapshots of the others, and indices where a hung GPU is known to sit are not asked at all.
:class:`GpuTable` applies an enumeration to the worker's GPUs: a GPU keeps its slot wherever it is
numbered, a new one gets a slot, one no longer enumerated is reported once as ``removed`` and dropped.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.common.breadcrumb import SLOT_ENUMERATION
from exporter.common.gpuid import gpu_key
from exporter.common.logs import log_once
from exporter.common.nvml import errors
from exporter.common.workerconfig import Exclusion
from exporter.worker.gpuslot import GpuSlot
from exporter.worker.nvml.client import NvmlClient, NvmlFatal, Stopping

log = logging.getLogger("exporter.worker")

__all__ = ["Enumeration", "Enumerator", "GpuTable", "Identity", "Rediscovery", "same_gpu"]


@dataclass(frozen=True)
class Identity:
    """The GPU NVML answered at one index.

    Attributes:
        index: the NVML index.
        uuid: ``nvmlDeviceGetUUID``; "" when it could not be read.
        bus_id: ``nvmlDeviceGetPciInfo().busId``, read only when the UUID could not be.
        handle: the device handle (``nvmlDeviceGetHandleByIndex``).
    """

    index: int
    uuid: str
    bus_id: str
    handle: Any

    @property
    def key(self) -> str:
        """The GPU's state key (:func:`exporter.common.gpuid.gpu_key`)."""
        return gpu_key(self.uuid, self.bus_id, self.index)


@dataclass
class Enumeration:
    """One reading of the index -> GPU map.

    Attributes:
        count: ``nvmlDeviceGetCount``.
        found: index -> the GPU read there.
        unreadable: index -> why its GPU could not be read (a lost GPU: GPU_IS_LOST, …).
        errors: index -> the NVML code name of that answer (``NO_PERMISSION``: the pod's device
            cgroup hides the GPU; ``GPU_IS_LOST`` …).
        skipped: indices not asked (a hung GPU is known to sit there).
        hung_at: the index whose read did not return within the deadline (indices after it were
            not read); None when the enumeration finished.
    """

    count: int
    found: dict[int, Identity] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    skipped: frozenset[int] = frozenset()
    hung_at: int | None = None

    def unknown(self) -> set[int]:
        """Indices below the count whose GPU this enumeration does not name."""
        return set(range(self.count)) - set(self.found)


class Enumerator:
    """Reads the index -> GPU map on its own thread, one enumeration at a time.

    Args:
        client: the worker's NVML client (forked to the enumeration breadcrumb slot).
        deadline_s: seconds one index's reads may take before the enumeration counts as hung.
        clock: monotonic clock (tests).
    """

    def __init__(self, client: NvmlClient, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client.fork(SLOT_ENUMERATION)
        self.deadline_s = deadline_s
        self.clock = clock
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="enumeration")
        self._future: concurrent.futures.Future[Enumeration] | None = None
        self._lock = threading.Lock()
        self._partial: Enumeration | None = None
        self._index_started = 0.0
        self._index = -1
        self._abandoned = False  # the running enumeration was reported hung: its late result is stale

    @property
    def busy(self) -> bool:
        """An enumeration's call has not returned (it may be abandoned as hung)."""
        return self._future is not None and not self._future.done()

    def start(self, count: int, skip: Collection[int] = (), progress: Callable[[str], None] | None = None) -> None:
        """Read indices ``0 .. count-1`` (except ``skip``) on the enumeration thread; ``progress`` is
        called from that thread with a step name after each index (start-up only: the supervisor's
        init deadline follows it)."""
        with self._lock:
            self._partial = Enumeration(count, skipped=frozenset(i for i in skip if 0 <= i < count))
            self._index, self._index_started = -1, self.clock()
            partial = self._partial
        self._abandoned = False
        self._future = self._executor.submit(self._read, partial, progress or (lambda step: None))

    def poll(self) -> Enumeration | None:
        """The enumeration, once finished; a partial one with :attr:`Enumeration.hung_at` set when an
        index's reads outlasted the deadline (the thread stays in that call); else None.

        Raises:
            NvmlFatal, Stopping: from the enumeration thread.
        """
        future = self._future
        if future is None:
            return None
        if future.done():
            self._future = None
            result = future.result()
            return None if self._abandoned else result
        with self._lock:
            partial, index, started = self._partial, self._index, self._index_started
        if self._abandoned or partial is None or index < 0 or self.clock() - started <= self.deadline_s:
            return None
        self._abandoned = True  # the thread's result, when its call returns at last, is stale
        hung = Enumeration(
            partial.count, dict(partial.found), dict(partial.unreadable), dict(partial.errors), partial.skipped, index
        )
        log.error(
            "GPU at index %d: reading its UUID did not return within %.1f s; the enumeration stops there "
            "(the GPUs after it keep their last known index) and is not asked again while that call hangs",
            index,
            self.deadline_s,
            extra={"gpu": index},
        )
        return hung

    def wait(
        self, count: int, skip: Collection[int] = (), progress: Callable[[str], None] | None = None
    ) -> Enumeration:
        """:meth:`start`, then wait until it finishes or an index outlasts the deadline (start-up).

        Raises:
            NvmlFatal, Stopping: from the enumeration thread.
        """
        self.start(count, skip, progress)
        while True:
            done = self.poll()
            if done is not None:
                return done
            future = self._future
            if future is not None:
                concurrent.futures.wait([future], timeout=min(0.05, self.deadline_s))

    def close(self) -> None:
        """Let the thread end once idle."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- on the enumeration thread ---------------------------------------------------------------

    def _read(self, out: Enumeration, progress: Callable[[str], None]) -> Enumeration:
        for index in range(out.count):
            if index in out.skipped:
                continue
            with self._lock:
                self._index, self._index_started = index, self.clock()
            ident, why, code = self._identify(index)
            with self._lock:
                if ident is not None:
                    out.found[index] = ident
                else:
                    out.unreadable[index], out.errors[index] = why, code
            progress(f"GPU {index} identified" if ident is not None else f"GPU {index} unreadable")
        with self._lock:
            self._index = -1
        return out

    def _identify(self, index: int) -> tuple[Identity | None, str, str]:
        """The handle and UUID at ``index`` (PCI bus id when the UUID cannot be read); (None, why,
        NVML code name) when the handle lookup fails or the GPU answers neither (FATAL raises)."""
        call = self.client.raw
        try:
            handle = call("init", "nvmlDeviceGetHandleByIndex", "", index)
        except Stopping:
            raise
        except Exception as exc:
            return (None, *self._failure(exc, "nvmlDeviceGetHandleByIndex"))
        try:
            return Identity(index, _text(call("init", "nvmlDeviceGetUUID", "", handle)), "", handle), "", ""
        except Stopping:
            raise
        except Exception as exc:
            why, code = self._failure(exc, "nvmlDeviceGetUUID")
        try:
            bus = _text(call("init", "nvmlDeviceGetPciInfo", "", handle).busId)
        except Stopping:
            raise
        except Exception as exc:
            more, _ = self._failure(exc, "nvmlDeviceGetPciInfo")
            return None, f"{why}; {more}", code
        return (Identity(index, "", bus, handle), "", "") if bus else (None, why, code)

    @staticmethod
    def _failure(exc: Exception, function: str) -> tuple[str, str]:
        """(what to say, the NVML code name) of a failed identity call; FATAL raises."""
        failure = errors.classify(exc, errors.Context.HANDLE_LOOKUP)
        if failure.error_class is errors.ErrorClass.FATAL:
            raise NvmlFatal(failure, function) from exc
        return f"{function}: {failure.message}", failure.name


def _text(value: Any) -> str:
    """A driver string as text (bytes decoded)."""
    return (value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)).strip()


class GpuTable:
    """The worker's GPUs, one :class:`~exporter.worker.gpuslot.GpuSlot` per GPU key, and what an
    enumeration does to them.

    Args:
        client: the worker's NVML client (each slot forks it).
        reprobe_s: the slots' re-probe period.
        exclude: the supervisor's exclusions (matched by UUID, or bus id where a UUID is missing).
    """

    def __init__(self, client: NvmlClient, reprobe_s: float, exclude: Sequence[Exclusion] = ()) -> None:
        self.client = client
        self.reprobe_s = reprobe_s
        self.exclude = tuple(exclude)
        self.slots: dict[str, GpuSlot] = {}  # GPU key (UUID, else PCI bus id) -> its slot
        self.retired: list[GpuSlot] = []  # removed GPUs whose call has not returned (breadcrumb kept)
        self.retired_calls = [0, 0]  # calls and answered calls of removed GPUs' threads: still counted
        self.retired_errors: Counter[tuple[str, str]] = Counter()

    def new_slot(self, index: int, **kwargs: Any) -> GpuSlot:
        """A slot with the lowest breadcrumb position no live slot holds (nor a removed one whose
        call has not returned: its record must stay readable)."""
        taken = {s.position for s in self.slots.values()} | {s.position for s in self.retired if s.busy}
        position = next(p for p in range(len(taken) + 1) if p not in taken)
        return GpuSlot(index, self.client, position=position, reprobe_s=self.reprobe_s, **kwargs)

    def add(self, slot: GpuSlot) -> GpuSlot:
        """Keep ``slot`` under its key."""
        self.slots[slot.key] = slot
        return slot

    def exclusion_for(self, uuid: str, bus_id: str) -> Exclusion | None:
        """The supervisor's exclusion of this GPU, if any."""
        return next((e for e in self.exclude if same_gpu(e.gpu.uuid, e.gpu.bus_id, uuid, bus_id)), None)

    def slot_for(self, uuid: str, bus_id: str) -> GpuSlot | None:
        """The slot of this GPU, if it has one."""
        return next((s for s in self.slots.values() if same_gpu(s.uuid, s.bus_id, uuid, bus_id)), None)

    def apply(self, found: Enumeration, hung: Mapping[int, Exclusion] | None = None, starting: bool = False) -> None:
        """Take an enumeration: each GPU it names keeps its slot (its index label follows) or gets a
        new one (attached at the next sample); an index it could not read stays with the GPU last
        seen there; a GPU it no longer names is removed (reported once, then dropped).

        Args:
            found: the enumeration.
            hung: start-up: index -> the hung exclusion last seen there (not asked: its slot takes it).
            starting: the first enumeration of this worker (new GPUs are not news).
        """
        seen: set[int] = set()
        for index in sorted(found.found):
            seen.add(id(self._found(found.found[index], starting)))
        for index in sorted(found.unknown()):
            holder = next((s for s in self.slots.values() if s.index == index and id(s) not in seen), None)
            if holder is None:
                excluded = (hung or {}).get(index)
                if excluded is not None:
                    ref = excluded.gpu
                    holder = self.new_slot(
                        index, uuid=ref.uuid, bus_id=ref.bus_id, state=excluded.state, detail=excluded.detail
                    )
                else:
                    holder = self.new_slot(index, detail=found.unreadable.get(index) or "its UUID could not be read")
                    holder.error = found.errors.get(index, "")
                self.add(holder)
            seen.add(id(holder))
        for slot in self.slots.values():
            if id(slot) not in seen and not slot.removed:
                slot.removed = True
                if slot.uuid or slot.bus_id:
                    log.warning(
                        "%s removed: NVML no longer enumerates it (drained, unplugged or fallen off the bus); its "
                        "series are dropped",
                        slot.label(),
                        extra={"gpu": slot.index, "uuid": slot.uuid, "pci_bus_id": slot.bus_id},
                    )

    def _found(self, ident: Identity, starting: bool) -> GpuSlot:
        """The slot of a GPU the enumeration read: its own (moved if its index changed; a lost one
        attaches again with the fresh handle), or a new one."""
        slot = self.slot_for(ident.uuid, ident.bus_id)
        if slot is not None:
            if slot.index != ident.index:
                slot.moved(ident.index)
            if slot.state == "lost" and not slot.busy:
                slot.handle = ident.handle  # attached again with the fresh handle (after a reset)
            slot.removed = False
            return slot
        slot = self.new_slot(ident.index, uuid=ident.uuid, bus_id=ident.bus_id, handle=ident.handle)
        excluded = self.exclusion_for(ident.uuid, ident.bus_id)
        if excluded is not None:
            slot.state, slot.detail, slot.handle = excluded.state, excluded.detail, None
        elif not starting:
            log.warning(
                "%s appeared: NVML enumerates it now (hot-added or discovered again); it is attached and sampled",
                slot.label(),
                extra={"gpu": ident.index, "uuid": slot.uuid},
            )
        return self.add(slot)

    def attached(self, slot: GpuSlot) -> str:
        """After an attach: key the slot by the UUID it read. Returns a reason to enumerate again
        ("" for none): the lookup found another GPU, or a placeholder's GPU has a slot already."""
        why = ""
        if slot.mismatch:
            why, slot.mismatch = f"{slot.label()}: {slot.detail}", ""
        key = next((k for k, v in self.slots.items() if v is slot), None)
        if key is not None and key != slot.key:
            del self.slots[key]
            if slot.key in self.slots:  # that GPU has its slot already: this one was a placeholder
                self.retire(slot)
                return why or f"{slot.label()} appeared at another index"
            self.add(slot)
        return why

    def retire(self, slot: GpuSlot) -> None:
        """A slot leaves: its counters stay in the totals; its breadcrumb position stays taken while its
        thread is in a call."""
        self.retired_calls[0] += slot.client.calls
        self.retired_calls[1] += slot.client.ok_calls
        self.retired_errors.update(dict(slot.client.errors))
        self.retired = [s for s in self.retired if s.busy]
        if slot.busy:
            self.retired.append(slot)
        slot.close()

    def command(self, cmd: Mapping[str, Any]) -> None:
        """The supervisor's ``readmit`` (a hung or crashed GPU's probe succeeded: attach it again) or
        ``reprobe`` of the GPU ``cmd["gpu"]`` (its key)."""
        slot = self.slots.get(str(cmd.get("gpu", "")))
        if slot is None:
            return
        if cmd.get("type") == "reprobe":
            slot.request_reprobe()
        elif cmd.get("type") == "readmit" and slot.state in ("hung", "crashed") and not slot.busy:
            log.info("%s: readmitted after a successful probe", slot.label())
            slot.state, slot.dev = "lost", None
            slot.start_attach()

    def calls(self, others: Sequence[NvmlClient]) -> tuple[int, int]:
        """(calls, calls that answered) of ``others`` and every GPU's thread, removed ones included."""
        clients = [*others, *(s.client for s in self.slots.values())]
        calls, ok = self.retired_calls
        return calls + sum(c.calls for c in clients), ok + sum(c.ok_calls for c in clients)

    def errors(self, others: Sequence[NvmlClient]) -> Counter[tuple[str, str]]:
        """(feature, NVML error name) -> count of ``others`` and every GPU's thread, removed ones included."""
        total: Counter[tuple[str, str]] = Counter(self.retired_errors)
        for c in [*others, *(s.client for s in self.slots.values())]:
            total.update(dict(c.errors))
        return total

    def drop_removed(self) -> None:
        """Removed GPUs were in one snapshot: drop them."""
        for key, slot in list(self.slots.items()):
            if slot.removed:
                del self.slots[key]
                self.retire(slot)


class Rediscovery:
    """When the worker reads the index -> GPU map again: when the GPU count changed, when something
    asked (a lost GPU, a reset or bus event, another GPU answering at an index), and every
    ``period_s``. The count is one cheap call per sample on the main thread; the UUID reads run on
    the enumeration thread, and a finished enumeration is applied at the next sample.

    Args:
        enumerator: reads the map (None: a probe, which never enumerates).
        table: the worker's GPUs.
        period_s: the longest time between two enumerations.
        deadline_s: a GPU busy for longer counts as hung: its index is not asked.
        clock: monotonic clock (tests).
    """

    def __init__(
        self,
        enumerator: Enumerator | None,
        table: GpuTable,
        period_s: float,
        deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enumerator = enumerator
        self.table = table
        self.period_s = period_s
        self.deadline_s = deadline_s
        self.clock = clock
        self.count: int | None = None  # nvmlDeviceGetCount when the last enumeration started
        self.why = ""  # a reason to enumerate at the next sample
        self.next_at = clock() + period_s

    def ask(self, why: str) -> None:
        """Enumerate at the next sample (``why`` for the log; "" asks nothing)."""
        self.why = self.why or why

    def step(self, client: NvmlClient) -> None:
        """Once per sample: apply a finished enumeration, then start one if one is due.

        Raises:
            NvmlFatal, Stopping: from the count or the enumeration thread.
        """
        enumerator = self.enumerator
        if enumerator is None:
            return
        done = enumerator.poll()
        if done is not None:
            self.table.apply(done)
        try:
            count = int(client.raw("init", "nvmlDeviceGetCount", ""))
        except Stopping:
            raise
        except Exception as exc:
            failure = errors.classify(exc)
            if failure.error_class is errors.ErrorClass.FATAL:
                raise NvmlFatal(failure, "nvmlDeviceGetCount") from exc
            log_once(log, logging.WARNING, ("count", failure.name), "nvmlDeviceGetCount: %s", failure.message)
            return
        now, why = self.clock(), self.why
        if count != self.count:
            why = f"the GPU count changed from {self.count} to {count}"
        elif not why and now >= self.next_at:
            why = "periodic"
        if not why or enumerator.busy:
            return
        if why != "periodic":
            log.info("reading every GPU's UUID per NVML index again: %s", why)
        slots = self.table.slots.values()
        hung = {s.index for s in slots if s.state == "hung" or s.busy and s.overdue(self.deadline_s)}
        self.count, self.why, self.next_at = count, "", now + self.period_s
        enumerator.start(count, skip=hung)


def same_gpu(uuid_a: str, bus_a: str, uuid_b: str, bus_b: str) -> bool:
    """Two identities name one GPU: the same UUID, or (where a UUID is missing) the same bus id."""
    if uuid_a and uuid_b:
        return uuid_a == uuid_b
    return bool(bus_a and bus_b) and bus_a.upper() == bus_b.upper()
