"""exporter.common.nvml.errors: the one table that says what an NVML error means.

The expected table below is written from nvml.h's return codes and what each means for an exporter, independently of
the module's own table: every return code the module knows must appear here, so a new code forces
a decision in review.
"""

from __future__ import annotations

import pynvml
import pytest

from exporter.common.nvml import errors
from exporter.common.nvml.errors import ErrorClass as C

EXPECTED: dict[str, C] = {
    # unsupported / denied: cache, log once, omit, never ask again
    "NOT_SUPPORTED": C.UNSUPPORTED,
    "FUNCTION_NOT_FOUND": C.UNSUPPORTED,
    "ARGUMENT_VERSION_MISMATCH": C.UNSUPPORTED,
    "NO_PERMISSION": C.UNSUPPORTED,
    "DEPRECATED": C.UNSUPPORTED,
    "VGPU_ECC_NOT_SUPPORTED": C.UNSUPPORTED,
    # absent: omit this sample quietly
    "NOT_FOUND": C.ABSENT,
    "NO_DATA": C.ABSENT,
    "TIMEOUT": C.ABSENT,
    # device lost: drop that GPU, re-enumerate later
    "GPU_IS_LOST": C.DEVICE_LOST,
    "RESET_REQUIRED": C.DEVICE_LOST,
    "IRQ_ISSUE": C.DEVICE_LOST,
    "INSUFFICIENT_POWER": C.DEVICE_LOST,
    "CORRUPTED_INFOROM": C.DEVICE_LOST,
    "GPU_NOT_FOUND": C.DEVICE_LOST,
    # fatal: the library is unusable, the worker exits and is re-initialised with backoff
    "UNINITIALIZED": C.FATAL,
    "DRIVER_NOT_LOADED": C.FATAL,
    "LIBRARY_NOT_FOUND": C.FATAL,
    "LIB_RM_VERSION_MISMATCH": C.FATAL,
    # bug: our mistake, logged with a traceback and counted
    "INVALID_ARGUMENT": C.BUG,
    "INSUFFICIENT_SIZE": C.BUG,
    "ALREADY_INITIALIZED": C.BUG,
    # transient: omit this sample, count it
    "OPERATING_SYSTEM": C.TRANSIENT,
    "IN_USE": C.TRANSIENT,
    "MEMORY": C.TRANSIENT,
    "INSUFFICIENT_RESOURCES": C.TRANSIENT,
    "FREQ_NOT_SUPPORTED": C.TRANSIENT,
    "NOT_READY": C.TRANSIENT,
    "INVALID_STATE": C.TRANSIENT,
    "RESET_TYPE_NOT_SUPPORTED": C.TRANSIENT,
    "UNKNOWN": C.TRANSIENT,
}

# nvml.h numbering, to catch a renumbered constant.
NVML_H = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "LIB_RM_VERSION_MISMATCH": 18,
    "NO_DATA": 21,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "GPU_NOT_FOUND": 28,
    "RESET_TYPE_NOT_SUPPORTED": 30,
    "UNKNOWN": 999,
}


def test_table_covers_every_known_code() -> None:
    assert set(errors.NAME_CODES) == set(EXPECTED)
    assert "SUCCESS" not in errors.NAME_CODES


@pytest.mark.parametrize("name", sorted(NVML_H))
def test_codes_match_nvml_h(name: str) -> None:
    assert errors.NAME_CODES[name] == NVML_H[name]
    assert getattr(pynvml, f"NVML_ERROR_{name}") == NVML_H[name]  # and the binding agrees


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_classify_real_pynvml_error(name: str) -> None:
    code = errors.NAME_CODES[name]
    exc = pynvml.NVMLError(code)  # pynvml returns its per-code subclass where it has one
    failure = errors.classify(exc)
    assert failure.error_class is EXPECTED[name]
    assert failure.code == code and failure.name == name
    assert failure.message.startswith(f"{name}: ")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_classify_by_code_not_by_class(name: str) -> None:
    """An older binding raises the base class (or its own class) for codes it does not know."""

    class NVMLError(Exception):  # noqa: N818 - the binding's spelling
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    assert errors.classify(NVMLError(errors.NAME_CODES[name])).error_class is EXPECTED[name]


def test_unknown_code_is_transient_and_named() -> None:
    failure = errors.classify(pynvml.NVMLError(4242))
    assert failure.error_class is C.TRANSIENT
    assert failure.code == 4242 and failure.name == "CODE_4242"
    assert errors.code_name(4242) == "CODE_4242"
    assert errors.code_name(999) == "UNKNOWN"


def test_missing_binding_function_is_function_not_found() -> None:
    failure = errors.classify(AttributeError("module 'pynvml' has no attribute 'nvmlDeviceGetFanSpeed_v2'"))
    assert failure.code == errors.FUNCTION_NOT_FOUND and failure.name == "FUNCTION_NOT_FOUND"
    assert failure.error_class is C.UNSUPPORTED


def test_library_mismatch_is_function_not_found() -> None:
    """pynvml raises a plain Exception subclass when a versioned process-list symbol is absent."""
    real = errors.classify(pynvml.NVMLLibraryMismatchError("nvmlDeviceGetComputeRunningProcesses_v3"))
    assert real.code == errors.FUNCTION_NOT_FOUND and real.error_class is C.UNSUPPORTED

    class NVMLLibraryMismatchError(Exception):  # noqa: N818 - same name, another binding's class
        pass

    other = errors.classify(NVMLLibraryMismatchError("v3 missing"))
    assert other.code == errors.FUNCTION_NOT_FOUND and other.error_class is C.UNSUPPORTED


@pytest.mark.parametrize(
    "exc", [ValueError("bad"), TypeError("x"), KeyError("k"), RuntimeError("r")], ids=lambda e: type(e).__name__
)
def test_non_nvml_exception_is_a_bug(exc: Exception) -> None:
    failure = errors.classify(exc)
    assert failure.error_class is C.BUG and failure.code == -1
    assert failure.name == type(exc).__name__ and type(exc).__name__ in failure.message


def test_nvml_named_exception_without_int_value_is_a_bug() -> None:
    class NVMLError_Odd(Exception):  # noqa: N801,N818
        value = "15"

    assert errors.code_of(NVMLError_Odd()) is None
    assert errors.classify(NVMLError_Odd()).error_class is C.BUG


def test_value_attribute_alone_does_not_make_an_nvml_error() -> None:
    class Other(Exception):
        value = 15

    assert errors.code_of(Other()) is None


HANDLE_OVERRIDES = {"UNKNOWN": C.DEVICE_LOST, "INVALID_ARGUMENT": C.DEVICE_LOST}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_handle_lookup_overrides(name: str) -> None:
    """On nvmlDeviceGetHandleByIndex/ByUUID, UNKNOWN (Xid 79 can surface so) and INVALID_ARGUMENT
    mean the GPU is gone; every other code keeps its ordinary class."""
    exc = pynvml.NVMLError(errors.NAME_CODES[name])
    assert errors.classify(exc, errors.Context.HANDLE_LOOKUP).error_class is HANDLE_OVERRIDES.get(name, EXPECTED[name])
    assert errors.classify(exc, errors.Context.CALL).error_class is EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_classify_code_for_field_value_entries(name: str) -> None:
    """Per field-value entry, INVALID_ARGUMENT means "no such field / link here": unsupported."""
    want = C.UNSUPPORTED if name == "INVALID_ARGUMENT" else EXPECTED[name]
    assert errors.classify_entry(errors.NAME_CODES[name]).error_class is want


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("GPU_IS_LOST", 15),
        ("gpu_is_lost", 15),
        ("NVML_ERROR_GPU_IS_LOST", 15),
        ("nvml_error_not_supported", 3),
        ("  NOT_SUPPORTED ", 3),
        ("999", 999),
        ("15", 15),
        (15, 15),
        (0, 0),
        ("NVML_ERROR_15", 15),
        ("UNKNOWN", 999),
    ],
)
def test_parse_code(text: str | int, code: int) -> None:
    assert errors.parse_code(text) == code


@pytest.mark.parametrize("text", ["GPU_LOST", "", "NVML_ERROR_", "SUCCESS", "not supported", "-1", "1.5"])
def test_parse_code_errors_name_the_input_and_the_choices(text: str) -> None:
    with pytest.raises(ValueError) as info:
        errors.parse_code(text)
    message = str(info.value)
    assert repr(text) in message
    assert "GPU_IS_LOST" in message and "NOT_SUPPORTED" in message


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_indexed_calls(name: str) -> None:
    """A per-link / per-fan / per-counter call answering INVALID_ARGUMENT names an index the GPU
    does not have: cached as unsupported; every other code keeps its ordinary class."""
    exc = pynvml.NVMLError(errors.NAME_CODES[name])
    want = C.UNSUPPORTED if name == "INVALID_ARGUMENT" else EXPECTED[name]
    assert errors.classify(exc, errors.Context.INDEXED).error_class is want


@pytest.mark.parametrize(
    ("calls", "ok", "fatal"),
    [(10, 0, True), (1, 0, True), (10, 1, False), (0, 0, False), (10, 10, False)],
)
def test_sample_failed_everywhere(calls: int, ok: int, fatal: bool) -> None:
    """A sample whose every NVML call failed means NVML is unusable (re-init cures it); a sample
    that needed no call, or had one answer, does not."""
    failure = errors.sample_failed_everywhere(calls, ok)
    assert (failure is not None) is fatal
    if failure is not None:
        assert failure.error_class is C.FATAL and failure.name == "UNKNOWN"
