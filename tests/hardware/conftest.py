"""Hardware tests: only where a real NVIDIA GPU and nvidia-smi are present; skipped cleanly elsewhere."""

from __future__ import annotations

import shutil

import pytest


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU here"
        return 0


GPU_COUNT = _gpu_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/hardware" in str(item.fspath):
            item.add_marker(pytest.mark.hardware)
            if GPU_COUNT == 0:
                item.add_marker(pytest.mark.skip(reason="no NVIDIA GPU / nvidia-smi on this machine"))
