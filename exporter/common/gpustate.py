"""Per-GPU worker state: what collectors remember about one GPU between sample passes.

A collector that keeps something between passes declares it as a small mutable dataclass deriving
from :class:`GpuState`, with its :class:`Lifetime` as the class attribute ``LIFETIME`` and a
default for every field, and reaches this GPU's instance through
``DeviceClient.state_of(Kind)`` (``exporter.worker.nvml.client``): made on first use, typed, one per
GPU and kind. Each GPU's states are used only on that GPU's sampling thread.

What each lifetime means (what ends it):

- :attr:`Lifetime.PROBE`: static readings, asked again at every re-probe (``DeviceClient.forget``:
  periodically, and after a MIG configuration change, a reset or recovery event or a readmission):
  identity, the fan count, maximum clocks and link widths, the NVLink list, the MIG layout while
  MIG is off, "GPM is not on this GPU".
- :attr:`Lifetime.DEVICE`: the device client's life. Kept across re-probes; gone when the GPU is
  lost or attached again, since what it holds belongs to the old handle: GPM sample buffers, the
  last counter values read, the MIG shape last logged.
- :attr:`Lifetime.WORKER`: the worker's life, by GPU UUID. Kept across re-probes and across a
  GPU attached again (:meth:`GpuStates.reattached`): what is exported as counted "since the worker
  started", and the process-struct fallback a binding and driver pair needs.

Standard library only: imported by the device client and by every collector.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, TypeVar, cast


class Lifetime(enum.Enum):
    """How long a :class:`GpuState` is kept (see the module docstring)."""

    PROBE = "probe"
    DEVICE = "device"
    WORKER = "worker"


class GpuState:
    """Base of a collector's per-GPU state: a subclass sets ``LIFETIME`` and builds with no arguments.

    Raises:
        TypeError: at class definition, for a subclass whose ``LIFETIME`` is not a :class:`Lifetime`.
    """

    LIFETIME: ClassVar[Lifetime]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "LIFETIME", None), Lifetime):
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: set LIFETIME to a gpustate.Lifetime")


S = TypeVar("S", bound=GpuState)
_Store = dict[type[GpuState], GpuState]


class GpuStates:
    """One GPU's states, by lifetime and kind.

    Args:
        worker: the :attr:`Lifetime.WORKER` states to keep (from :meth:`reattached`); empty when None.
    """

    def __init__(self, worker: _Store | None = None) -> None:
        self._stores: dict[Lifetime, _Store] = {
            Lifetime.PROBE: {},
            Lifetime.DEVICE: {},
            Lifetime.WORKER: {} if worker is None else worker,
        }

    def of(self, kind: type[S]) -> S:
        """This GPU's ``kind``, made with ``kind()`` on first use in its lifetime."""
        store = self._stores[kind.LIFETIME]
        found = store.get(kind)
        if found is None:
            found = store[kind] = kind()
        return cast(S, found)

    def peek(self, kind: type[S]) -> S | None:
        """This GPU's ``kind`` if it was made, else None (nothing is made: for a reader on another
        thread than the GPU's)."""
        return cast("S | None", self._stores[kind.LIFETIME].get(kind))

    def holds(self, lifetime: Lifetime) -> bool:
        """Whether any state of ``lifetime`` was made (and not forgotten since)."""
        return bool(self._stores[lifetime])

    def forget(self) -> None:
        """A re-probe: the :attr:`Lifetime.PROBE` states go; the others stay."""
        self._stores[Lifetime.PROBE].clear()

    def reattached(self) -> GpuStates:
        """The states of a new device client of the same GPU (same UUID): the
        :attr:`Lifetime.WORKER` ones carried over, nothing else."""
        return GpuStates(self._stores[Lifetime.WORKER])
