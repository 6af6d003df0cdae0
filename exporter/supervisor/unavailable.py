"""What an NVML failure at init means, and the one line that tells the operator.

Three kinds must not be confused (docs/design.md, "Failure model"): a node without an NVIDIA device (the
demo hint is for it, and only for it: no device node, no kernel module, never a GPU since start);
NVML that worked and then answers UNKNOWN to everything (a container that lost its device access:
liveness fails after ``NVGPU_UNHEALTHY_AFTER_SECONDS``, a restart cures it); and
LIB_RM_VERSION_MISMATCH (the userspace driver was upgraded under a loaded kernel module: only a
driver reload or a reboot cures it, so liveness never fails and re-init runs at most once a minute).
"""

from __future__ import annotations

import glob
import logging
import time

from exporter.common import nativelib
from exporter.common.snapshot import InitFailed
from exporter.supervisor.served import ServedState

log = logging.getLogger("exporter.supervisor")
# The no-GPU hint ends with this, a whole command to paste; its log record carries no field after it.
DEMO_COMMAND = "nvgpu-exporter --nvml-backend fake:h200x2"


def nvidia_present(dev_glob: str = "/dev/nvidia*") -> bool:
    """Whether this node has any NVIDIA device node."""
    return bool(glob.glob(dev_glob))


def record(state: ServedState, msg: InitFailed, unhealthy_after_s: float) -> str:
    """Apply a failed init to the served state; returns the log line that explains it."""
    nvml = state.nvml
    state.nvml_up = False
    state.last_init_error = f"NVML unavailable: {msg.message}"
    state.add_errors(msg.errors)
    nvml.init_failures[msg.error] += 1
    nvml.last_error = msg.error
    nvml.kernel_module_version = msg.kernel_module_version or nvml.kernel_module_version
    if msg.error == "UNKNOWN" and nvml.ever_worked:
        if nvml.broken_since is None:
            nvml.broken_since = time.monotonic()
    else:
        nvml.broken_since = None
    return explain(state, msg, unhealthy_after_s)


def explain(state: ServedState, msg: InitFailed, unhealthy_after_s: float) -> str:
    """What an NVML failure means for the operator, in one line."""
    nvml = state.nvml
    if msg.error == "LIB_RM_VERSION_MISMATCH":
        return (
            f"NVML unavailable: the NVML library ({state.system.nvml_version or 'userspace'}) does not match "
            f"the loaded kernel module ({nvml.kernel_module_version or 'unknown'}): the driver was upgraded under "
            "a loaded module. Reload the NVIDIA driver or reboot the node; restarting the exporter does not help "
            f"(re-init at most once a minute). {msg.message}"
        )
    if msg.error == "UNKNOWN" and nvml.ever_worked:
        return (
            f"NVML unavailable: UNKNOWN on every call and re-init after it worked ({msg.message}); the container "
            "likely lost its device access (e.g. a host `systemctl daemon-reload`). /healthz fails after "
            f"{unhealthy_after_s:g} s so the kubelet restarts the container"
        )
    no_device = (
        msg.error in ("LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED")
        and not nvml.ever_worked
        and not nvml.kernel_module_version
        and not nvidia_present()
    )
    if no_device:
        return (
            f"{state.last_init_error}; this machine has no NVIDIA driver or device. Without a GPU, try the "
            f"demo: {DEMO_COMMAND}"
        )
    return f"{state.last_init_error}; retrying with backoff"


def native_reported(state: ServedState, native: nativelib.NativeLibrary | None) -> None:
    """The worker's native library check (:mod:`exporter.common.nativelib`): kept, and logged when it
    changes (a problem at WARNING with what to do; a host driver replaced under the node at ERROR)."""
    if not state.set_native(native) or native is None:
        return
    level = logging.ERROR if native.state == "driver_upgraded" else logging.WARNING if native.problem else logging.INFO
    log.log(
        level,
        "native library: %s",
        nativelib.describe(native),
        extra={
            "library_path": native.realpath or native.path,
            "library_origin": native.origin,
            "library_version": native.library_version,
            "kernel_module_version": native.kernel_module_version,
            "native_state": native.state,
        },
    )
