"""The public reading of a collector says its shape, units and source: ``Reading`` lists its
attributes, ``read()`` says what it returns and raises, both naming the NVML calls or fields."""

from __future__ import annotations

import importlib

import pytest

# The collectors reviewed for it; the others are still to do (each added here once documented).
DOCUMENTED = {
    "c2c": ("NVML_FI_DEV_C2C_LINK_COUNT", "NVML_FI_DEV_C2C_LINK_GET_STATUS", "nvmlDeviceGetFieldValues"),
    "confidential_computing": ("nvmlSystemGetConfComputeState", "nvmlSystemGetConfComputeGpusReadyState", "bytes"),
    "fabric": ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo", "healthMask"),
    "temperature": ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperatureThreshold", "°C"),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_reading_and_read_give_shape_units_and_source(name: str) -> None:
    mod = importlib.import_module(f"exporter.common.collectors.{name}")
    reading = mod.Reading.__doc__ or ""
    read = mod.read.__doc__ or ""
    assert not reading.startswith("Reading("), f"{name}.Reading has no docstring (only the dataclass signature)"
    assert "Attributes:" in reading, f"{name}.Reading: no Attributes section"
    assert "Returns:" in read and "Raises:" in read, f"{name}.read: Returns and Raises"
    for word in DOCUMENTED[name]:
        assert word in reading + read, f"{name}: {word!r} not named in Reading or read"
