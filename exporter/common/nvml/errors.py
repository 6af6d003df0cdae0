"""The one place that decides what an NVML error means.

Errors are classified by numeric return code, never by exception class: older bindings lack the
newer classes (a code a binding does not know arrives as the base ``NVMLError``), and a function
missing from the binding or the driver is treated as "function not found". Codes and their meaning
come from ``nvml.h`` (NVML 13.x, as vendored in NVIDIA/go-nvml ``pkg/nvml/nvml.h``) and the classes
nvidia-ml-py generates from them (``NVML_ERROR_FOO_BAR`` -> ``NVMLError_FooBar``).

Collectors let errors propagate; the device client and the sampler ask :func:`classify` (or
:func:`classify_entry`, :func:`sample_failed_everywhere`) what to do. Every rule lives here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ErrorClass(str, enum.Enum):
    """What the worker does with an error."""

    UNSUPPORTED = "unsupported"  # cache per (GPU, function), log once, omit, never call again
    ABSENT = "absent"  # omit this sample quietly (no data right now)
    TRANSIENT = "transient"  # omit this sample, count it
    DEVICE_LOST = "device_lost"  # drop that GPU's series, mark it down, re-enumerate later
    FATAL = "fatal"  # the library is unusable: the worker exits with EXIT_NVML_FATAL
    BUG = "bug"  # our mistake: log with traceback, count it


# NVML return codes (nvml.h, nvmlReturn_t).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
ALREADY_INITIALIZED = 5
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
INSUFFICIENT_POWER = 8
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
IRQ_ISSUE = 11
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
CORRUPTED_INFOROM = 14
GPU_IS_LOST = 15
RESET_REQUIRED = 16
OPERATING_SYSTEM = 17
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
MEMORY = 20
NO_DATA = 21
VGPU_ECC_NOT_SUPPORTED = 22
INSUFFICIENT_RESOURCES = 23
FREQ_NOT_SUPPORTED = 24
ARGUMENT_VERSION_MISMATCH = 25
DEPRECATED = 26
NOT_READY = 27
GPU_NOT_FOUND = 28
INVALID_STATE = 29
RESET_TYPE_NOT_SUPPORTED = 30
UNKNOWN = 999

CODE_NAMES: dict[int, str] = {
    value: name for name, value in globals().items() if name.isupper() and isinstance(value, int) and name != "SUCCESS"
}
NAME_CODES: dict[str, int] = {name: code for code, name in CODE_NAMES.items()}

_C = ErrorClass
# Return code -> class for an ordinary per-GPU query. Anything not listed is TRANSIENT.
_TABLE: dict[int, ErrorClass] = {
    NOT_SUPPORTED: _C.UNSUPPORTED,
    FUNCTION_NOT_FOUND: _C.UNSUPPORTED,  # symbol absent, or struct version unknown to the driver
    ARGUMENT_VERSION_MISMATCH: _C.UNSUPPORTED,
    NO_PERMISSION: _C.UNSUPPORTED,  # container / cgroup limits: asking again will not help
    DEPRECATED: _C.UNSUPPORTED,
    VGPU_ECC_NOT_SUPPORTED: _C.UNSUPPORTED,
    NOT_FOUND: _C.ABSENT,  # "no samples newer than the timestamp", empty MIG slot
    # pynvml's nvmlDeviceGetProcessUtilization raises NVMLError(ret) for any first-call result
    # but INSUFFICIENT_SIZE, SUCCESS included (nothing to return): no samples.
    SUCCESS: _C.ABSENT,
    NO_DATA: _C.ABSENT,
    TIMEOUT: _C.ABSENT,  # normal for event waits
    GPU_IS_LOST: _C.DEVICE_LOST,
    RESET_REQUIRED: _C.DEVICE_LOST,
    IRQ_ISSUE: _C.DEVICE_LOST,
    INSUFFICIENT_POWER: _C.DEVICE_LOST,
    CORRUPTED_INFOROM: _C.DEVICE_LOST,
    GPU_NOT_FOUND: _C.DEVICE_LOST,
    UNINITIALIZED: _C.FATAL,
    DRIVER_NOT_LOADED: _C.FATAL,
    LIBRARY_NOT_FOUND: _C.FATAL,
    LIB_RM_VERSION_MISMATCH: _C.FATAL,
    INVALID_ARGUMENT: _C.BUG,  # on a per-call basis; per-link / per-field callers override
    INSUFFICIENT_SIZE: _C.BUG,  # the wrappers handle it; reaching us is a bug
    ALREADY_INITIALIZED: _C.BUG,
}


# Unsupported answers that do not change while the worker lives (the symbol or struct version is
# missing from this binding/driver pair); NOT_SUPPORTED and NO_PERMISSION can change (MIG mode,
# a reset, a container's device access), so a re-probe asks those again.
PERMANENTLY_UNSUPPORTED = frozenset({"FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH", "DEPRECATED"})


class Context(str, enum.Enum):
    """Where a return code came from; some codes mean something else there."""

    CALL = "call"  # an ordinary per-GPU query
    INDEXED = "indexed"  # a per-link / per-fan / per-counter query: the index may not exist
    HANDLE_LOOKUP = "handle_lookup"  # nvmlDeviceGetHandleByIndex / ByUUID / ByPciBusId
    FIELD_ENTRY = "field_entry"  # the per-entry code of one nvmlDeviceGetFieldValues result
    MIG_DEVICE = "mig_device"  # a call on a MIG device handle or a GPU instance id (exporter/common/collectors/mig.py)


# Per-context exceptions to _TABLE, each with its reason:
# - INDEXED: INVALID_ARGUMENT means "this GPU has no such link / fan / counter" (indices past the
#   real count answer it: NVIDIA/TensorRT-LLM PR #17060), so it is cached like NOT_SUPPORTED.
# - HANDLE_LOOKUP: UNKNOWN means the GPU is gone (gpud: Xid 79 can surface as "Unknown Error" from
#   nvmlDeviceGetHandleByIndex), and INVALID_ARGUMENT for an index NVML just counted means the same.
# - FIELD_ENTRY: INVALID_ARGUMENT means "no such field / scope on this driver" (measured on 580.159.04:
#   field ids newer than the driver, and a scope a field does not take).
# - MIG_DEVICE: INVALID_ARGUMENT means the MIG device (or GPU instance) went away between its
#   enumeration and this call. NVML API reference, nvmlDeviceGetMigDeviceHandleByIndex: "If the
#   compute instance is destroyed either explicitly or by destroying, resetting or unbinding the
#   parent GPU instance or the GPU device itself the MIG device handle would remain invalid and
#   must be requested again"; the next sample enumerates again, so it only omits this reading.
_OVERRIDES: dict[Context, dict[int, ErrorClass]] = {
    Context.CALL: {},
    Context.INDEXED: {INVALID_ARGUMENT: _C.UNSUPPORTED},
    Context.HANDLE_LOOKUP: {UNKNOWN: _C.DEVICE_LOST, INVALID_ARGUMENT: _C.DEVICE_LOST},
    Context.FIELD_ENTRY: {INVALID_ARGUMENT: _C.UNSUPPORTED},
    Context.MIG_DEVICE: {INVALID_ARGUMENT: _C.ABSENT},
}


@dataclass(frozen=True)
class NvmlFailure:
    """A classified NVML failure.

    Attributes:
        code: NVML return code (``FUNCTION_NOT_FOUND`` for a missing binding function).
        name: code name without the ``NVML_ERROR_`` prefix, e.g. ``"GPU_IS_LOST"``.
        error_class: what the caller does with it.
        message: text for logs.
    """

    code: int
    name: str
    error_class: ErrorClass
    message: str


def code_name(code: int) -> str:
    """Name of an NVML return code without the prefix, ``"CODE_<n>"`` if unknown."""
    return CODE_NAMES.get(code, f"CODE_{code}")


def parse_code(value: str | int) -> int:
    """Turn ``"GPU_IS_LOST"``, ``"NVML_ERROR_GPU_IS_LOST"`` or ``15`` into a return code.

    Raises:
        ValueError: the name is not an NVML error name.
    """
    if isinstance(value, int):
        return value
    text = value.strip().upper()
    if text.startswith("NVML_ERROR_"):
        text = text[len("NVML_ERROR_") :]
    if text.isdigit():
        return int(text)
    if text not in NAME_CODES:
        raise ValueError(f"unknown NVML error name {value!r}; expected one of {sorted(NAME_CODES)}")
    return NAME_CODES[text]


def code_of(exc: BaseException) -> int | None:
    """Return the NVML return code an exception stands for, or None if it is not an NVML error.

    ``pynvml.NVMLError`` carries ``.value``; a missing binding attribute (``AttributeError`` from
    an old nvidia-ml-py) and pynvml's ``NVMLLibraryMismatchError`` (a plain Exception raised when a
    versioned process-list symbol is absent) count as FUNCTION_NOT_FOUND.
    """
    value = getattr(exc, "value", None)
    if type(exc).__name__.startswith("NVMLError") and isinstance(value, int):
        return value
    if isinstance(exc, AttributeError) or type(exc).__name__ == "NVMLLibraryMismatchError":
        return FUNCTION_NOT_FOUND
    return None


def class_of(code: int, context: Context = Context.CALL) -> ErrorClass:
    """The class of a return code in a context (the table above, then its overrides)."""
    return _OVERRIDES[context].get(code) or _TABLE.get(code, ErrorClass.TRANSIENT)


def classify(exc: BaseException, context: Context = Context.CALL) -> NvmlFailure:
    """Classify an exception raised by an NVML call.

    Args:
        exc: what the call raised.
        context: where the call was made (see :class:`Context`).

    Returns:
        The failure with its class; non-NVML exceptions are ``BUG`` with code ``-1``.
    """
    code = code_of(exc)
    if code is None:
        return NvmlFailure(-1, type(exc).__name__, ErrorClass.BUG, f"{type(exc).__name__}: {exc}")
    return NvmlFailure(code, code_name(code), class_of(code, context), f"{code_name(code)}: {exc}")


def classify_entry(code: int) -> NvmlFailure:
    """Classify the per-entry return code of a field-value result."""
    return NvmlFailure(code, code_name(code), class_of(code, Context.FIELD_ENTRY), f"field value: {code_name(code)}")


def sample_failed_everywhere(calls: int, ok_calls: int) -> NvmlFailure | None:
    """The "Unknown Error" state: a sample that made NVML calls and had none of them answer.

    After a driver problem (or a container that lost its device access) NVML answers UNKNOWN to
    every call; each call alone looks transient, together they mean the library is unusable and
    re-initialising in a fresh worker is the cure, so the sample is classified FATAL.

    Args:
        calls: NVML calls made during the sample.
        ok_calls: those that returned.

    Returns:
        A FATAL failure, or None when at least one call answered (or none was made).
    """
    if calls > 0 and ok_calls == 0:
        return NvmlFailure(UNKNOWN, "UNKNOWN", ErrorClass.FATAL, "every NVML call of this sample failed")
    return None
