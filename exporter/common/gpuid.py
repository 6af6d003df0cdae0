"""A GPU's identity in both processes: its UUID, its PCI bus id where the UUID cannot be read.

NVML numbers GPUs by enumeration order, and that order changes while a node runs: a drained GPU
(``nvidia-smi drain``, ``nvmlDeviceRemoveGpu``) leaves and every GPU after it moves down one index; a
GPU discovered again or hot-added appears. So every piece of per-GPU state (the worker's slots,
exclusions and attach list, the supervisor's health records, probes, ledgers, pod mapping) is
keyed by :func:`gpu_key`, and the NVML index is only the ``gpu`` label, read afresh at each
enumeration. Standard library only.
"""

from __future__ import annotations

__all__ = ["gpu_key"]


def gpu_key(uuid: str, bus_id: str = "", index: int = -1) -> str:
    """The key of a GPU's state: its UUID (``GPU-…``); its PCI bus id (``00000000:18:00.0``) when the
    UUID could not be read; ``#<index>`` for an index whose GPU answered neither (a lost GPU at
    start: the key holds until its identity can be read).
    """
    return uuid or bus_id.upper() or f"#{index}"
